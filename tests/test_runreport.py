"""``autofuse report`` on records as ``autofuse tune`` writes them: the HTML carries the
Markdown's caveats, draws its charts without matplotlib (SVG bars of their true length),
shows a roofline only where the run measured it, and names autofuse's version and commit."""

import json
import re
import sys

import pytest

import autofuse
from autofuse.tune.runreport import write_report


def _record(name: str, source: str, tuned: float, greedy: float, floor_source: str) -> dict:
    def us(v, s):
        return {"us": v, "source": s}

    return {"workload": name, "complete": True, "tuned_source": source, "trials": 4,
            "times_us": {"eager": us(None if source == "modeled" else 2 * tuned, source),
                         "autofuse greedy": us(greedy, source),
                         "autofuse tuned": us(tuned, source)},
            "floor_us": 0.004, "floor_source": floor_source, "fraction_of_floor": 0.004 / tuned,
            "kernels": [{"kernel": "k0", "kind": "pointwise", "ops": ["mul", "add"],
                         "config": "XBLOCK=64", "time_us": tuned, "source": source}],
            "history": [[0, greedy * 1e-6, "COMPLETE"], [1, tuned * 1e-6, "COMPLETE"]]}  # fmt: skip


@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises


def _run(tmp_path, *recs, stamp=None):
    (tmp_path / "run.json").write_text(json.dumps({"stamp": stamp or {"gpu": "cpu-model"}}))
    for rec in recs:
        (tmp_path / f"{rec['workload']}.json").write_text(json.dumps(rec))
    md, page = write_report(tmp_path)
    return md.read_text(), page.read_text()


def test_cpu_report_has_the_caveats_svg_bars_and_no_roofline(tmp_path, no_matplotlib, monkeypatch):
    monkeypatch.setenv("AUTOFUSE_COMMIT", "c0ffee1")
    md, page = _run(tmp_path, _record("chain", "modeled", 5.0, 7.5, "modeled"),
                    _record("softmax", "modeled", 4.0, 4.0, "modeled"))  # fmt: skip
    for doc in (md, page):
        assert "modeled" in doc and "cost model" in doc and "No roofline" in doc
        assert "floor" not in doc.replace("No roofline", "")  # no modeled floor anywhere
        assert f"report by autofuse {autofuse.__version__} (commit c0ffee1)" in doc
        assert "autofuse[report]" not in doc and "pip install matplotlib" in doc
    widths = [
        float(w) for w in re.findall(r"<rect x='220' y='\d+' width='([\d.]+)' height='15'", page)
    ]
    # speedups vs greedy 1.5x and 1.0x: bars in that ratio, neither of zero width
    assert len(widths) == 2 and widths[0] == pytest.approx(1.5 * widths[1]) and min(widths) > 100
    assert "<polyline" in page  # the optimization history


def test_measured_roofline_is_shown(tmp_path, no_matplotlib):
    md, page = _run(tmp_path, _record("chain", "measured", 5.0, 7.5, "measured"))
    assert "floor / tuned" in md and "Roofline floor / tuned time" in page
    assert "No roofline" not in page and "modeled" not in page
