"""``autofuse report DIR``: ``report.md`` and ``report.html`` for a folder ``autofuse tune``
wrote: the results table, speedup bars, roofline fractions, each study's optimization history
(best time vs trial, read from the study storage) and each chosen partition (which ops share a
kernel). With matplotlib (``pip install matplotlib``) the charts are PNG images; without it
the HTML draws them as inline SVG and the Markdown as text bars. Both carry the same caveats:
times the cost model produced are labelled *modeled*, and a roofline is shown only where the
run measured its ceilings on that machine (a GPU), never from another machine's constants.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from autofuse.tune import svg
from autofuse.tune.results import summary_row, workload_records
from autofuse.tune.roofline import autofuse_commit
from autofuse.tune.runfiles import RUN_FILE, read_json
from autofuse.version import __version__

_BAR = 40  # characters of the longest text bar


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{nd}g}" if isinstance(v, float) else str(v)


def history(folder: Path, rec: dict) -> list[tuple[int, float]]:
    """(trial, best time so far in µs) of the workload's study: from the study storage where
    it can be read, else from the history its JSON recorded."""
    trials = _stored_trials(folder, rec.get("study"))
    if trials is None:
        trials = [(n, v, s) for n, v, s in rec.get("history", [])]
    out, best = [], None
    for number, value, state in sorted(trials, key=lambda t: t[0]):
        if state == "COMPLETE" and value is not None:
            best = value if best is None else min(best, value)
        if best is not None:
            out.append((number, best * 1e6))
    return out


def _stored_trials(folder: Path, study: str | None) -> list[tuple] | None:
    run = read_json(folder / RUN_FILE) or {}
    storage = run.get("storage")
    if not study or not storage:
        return None
    try:
        import optuna

        from search import resolve_storage

        path = folder / storage
        if "://" not in storage and not path.exists() and not Path(storage).is_absolute():
            return None  # the run's own journal is not in the folder: never open one elsewhere
        target = str(path) if path.exists() else storage
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        s = optuna.load_study(study_name=study, storage=resolve_storage(target, folder))
        return [(t.number, t.value, t.state.name) for t in s.get_trials(deepcopy=False)]
    except Exception:  # noqa: BLE001 - a storage moved away: the JSON's history is used
        return None


def _text_bar(value: float | None, top: float) -> str:
    if not value or not top:
        return ""
    return "█" * max(1, round(_BAR * value / top)) + f" {value:.2f}x"


def _charts(folder: Path, rows: list[dict], hists: dict[str, list]) -> dict[str, bytes] | None:
    """PNG charts (speedups, roofline fractions, histories), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    out = {}
    names = [r["workload"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
    keys = [("speedup_vs_eager", "vs eager"), ("speedup_vs_best_compile", "vs best torch.compile"),
            ("speedup_vs_greedy", "vs greedy plan")]  # fmt: skip
    h = 0.8 / len(keys)
    for k, (key, label) in enumerate(keys):
        ax.barh([i + k * h for i in range(len(rows))], [r[key] or 0 for r in rows], h,
                label=label)  # fmt: skip
    ax.set_yticks([i + h for i in range(len(rows))], names)
    ax.set_ylim(-0.5, len(rows))
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("speedup of the tuned plan (x)")
    ax.legend(fontsize=8)
    out["speedups.png"] = _png(fig)
    if _measured_floor(rows):
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
        ax.barh(names, [r["fraction_of_floor"] or 0 for r in rows])
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("roofline floor / tuned time")
        out["roofline.png"] = _png(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, pts in hists.items():
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, drawstyle="steps-post")
    ax.set_xlabel("trial")
    ax.set_ylabel("best time so far (µs)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    out["history.png"] = _png(fig)
    for name, data in out.items():
        (folder / name).write_bytes(data)
    return out


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def write_report(folder: str | Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``folder``; returns their paths."""
    folder = Path(folder)
    recs = workload_records(folder)
    if not recs:
        raise SystemExit(f"autofuse report: no complete workload results in {folder}")
    run = read_json(folder / RUN_FILE) or {}
    rows = [summary_row(r) for r in recs]
    hists = {r["workload"]: history(folder, r) for r in recs}
    charts = _charts(folder, rows, hists)
    md = _markdown(run, recs, rows, hists, charts is not None)
    html_doc = _html(run, recs, rows, hists, charts)
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(html_doc)
    return folder / "report.md", folder / "report.html"


COLUMNS = [("workload", "workload"), ("eager_us", "eager µs"),
           ("compile_default_us", "compile default µs"),
           ("compile_max_autotune_us", "compile max-autotune µs"), ("greedy_us", "greedy µs"),
           ("tuned_us", "tuned µs"), ("tuned_source", "tuned is"), ("floor_us", "floor µs"),
           ("fraction_of_floor", "floor / tuned"), ("speedup_vs_best_compile", "vs best compile"),
           ("speedup_vs_greedy", "vs greedy"), ("tuned_graph_us", "tuned, CUDA graph µs"),
           ("graph_speedup_vs_best_compile", "CUDA graph vs best compile"), ("trials", "trials"),
           ("tuning_s", "tuning s")]  # fmt: skip


def _provenance(run: dict) -> str:
    """The run's provenance (device, autofuse commit and version, torch, triton, date) and the
    autofuse that wrote the report."""
    st = run.get("stamp", {})
    text = ", ".join(f"{k} {st[k]}" for k in ("gpu", "commit", "torch", "triton", "autofuse",
                                               "date") if k in st)  # fmt: skip
    return f"run: {text or 'no provenance recorded'}; report by autofuse {__version__} " \
        f"(commit {autofuse_commit()})"  # fmt: skip


def _measured_floor(rows: list[dict]) -> bool:
    return any(r["fraction_of_floor"] is not None for r in rows)


def caveats(rows: list[dict]) -> list[str]:
    """What the figures are and are not (the same sentences in the Markdown and the HTML)."""
    out = []
    if any(r["tuned_source"] == "modeled" for r in rows):
        out.append("Times labelled *modeled* come from the cost model (no GPU): estimates, not "
                   "measurements; torch.compile is not measured there.")  # fmt: skip
    if not _measured_floor(rows):
        out.append("No roofline: its ceilings were not measured on this machine (no GPU).")
    return out


def _columns(rows: list[dict]) -> list[tuple[str, str]]:
    """The table's columns, less those no row has a figure for (a roofline not measured)."""
    empty = {k for k, _ in COLUMNS if all(r[k] is None for r in rows)}
    return [(k, h) for k, h in COLUMNS if k not in empty or k in ("eager_us", "tuned_us")]


def _markdown(run, recs, rows, hists, have_charts: bool) -> str:
    out = ["# autofuse tune report", "", _provenance(run), ""]
    for line in caveats(rows):
        out += [line, ""]
    cols = _columns(rows)
    out += ["| " + " | ".join(h for _, h in cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r[k]) for k, _ in cols) + " |")
    out += ["", "## Speedup of the tuned plan", ""]
    if have_charts:
        roof = ["![roofline](roofline.png)", ""] if _measured_floor(rows) else []
        out += ["![speedups](speedups.png)", "", *roof, "![history](history.png)", ""]
    else:
        out += ["(matplotlib is not installed: text bars here, SVG charts in report.html; "
                "`pip install matplotlib` for PNG charts)", ""]  # fmt: skip
    top = max([r[k] or 0 for r in rows for k in ("speedup_vs_best_compile", "speedup_vs_greedy",
                                                   "speedup_vs_eager")] + [1.0])  # fmt: skip
    out.append("```")
    for r in rows:
        for key, label in (("speedup_vs_best_compile", "vs best compile"),
                           ("speedup_vs_greedy", "vs greedy")):  # fmt: skip
            if r[key]:
                out.append(f"{r['workload']:<24} {label:<16} {_text_bar(r[key], top)}")
        if r["fraction_of_floor"]:
            out.append(f"{r['workload']:<24} {'floor / tuned':<16} "
                       f"{'█' * max(1, round(_BAR * min(r['fraction_of_floor'], 1)))} "
                       f"{r['fraction_of_floor']:.2f}")  # fmt: skip
    out += ["```", "", "## Optimization history (best µs so far, by trial)", ""]
    for name, pts in hists.items():
        marks = ", ".join(f"{n}: {v:.4g}" for n, v in pts[:: max(1, len(pts) // 12)])
        out.append(f"- **{name}**: {marks or 'no finished trial'}")
    out += ["", "## Chosen partitions (ops that share a kernel)", ""]
    for rec in recs:
        out += [f"### {rec['workload']}", "", "```"]
        for k in rec.get("kernels", []):
            t = f"  {k['time_us']:.4g} µs ({k['source']})" if k.get("time_us") else ""
            out.append(f"[{k['kind']}] {k['kernel']}{t}")
            out.append("    " + " → ".join(k["ops"]) + f"    ({k['config']})")
        out += ["```", ""]
    return "\n".join(out) + "\n"


def _html(run, recs, rows, hists, charts: dict[str, bytes] | None) -> str:
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>autofuse tune report"
             "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:"
             "collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "td:first-child{text-align:left}.k{background:#eef4ff;margin:4px;padding:4px;"
             "display:inline-block;border-radius:4px}.op{background:#fff;border:1px solid #99b;"
             "margin:2px;padding:1px 4px;display:inline-block}</style></head><body>",
             "<h1>autofuse tune report</h1>", f"<p>{e(_provenance(run))}</p>"]  # fmt: skip
    parts += [f"<p><i>{e(line.replace('*', ''))}</i></p>" for line in caveats(rows)]
    cols = _columns(rows)
    parts += ["<table><tr>"] + [f"<th>{e(h)}</th>" for _, h in cols] + ["</tr>"]
    for r in rows:
        parts.append("<tr>" + "".join(f"<td>{e(_fmt(r[k]))}</td>" for k, _ in cols) + "</tr>")
    parts.append("</table>")
    if charts:
        for name, data in charts.items():
            b64 = base64.b64encode(data).decode()
            parts.append(f"<h2>{e(name[:-4])}</h2><img src='data:image/png;base64,{b64}'>")
    else:
        parts += _svg_charts(rows, hists)
    parts.append("<h2>Chosen partitions</h2>")
    for rec in recs:
        parts.append(f"<h3>{e(rec['workload'])}</h3><div>")
        for k in rec.get("kernels", []):
            ops = "".join(f"<span class='op'>{e(op)}</span>" for op in k["ops"])
            parts.append(f"<div class='k'><b>{e(k['kernel'])}</b> [{e(k['kind'])}]<br>{ops}"
                         f"<br><small>{e(str(k['config']))}</small></div>")  # fmt: skip
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _svg_charts(rows: list[dict], hists: dict[str, list]) -> list[str]:
    """The charts as inline SVG (no matplotlib): speedups, the roofline where measured, each
    study's best time by trial."""
    keys = [("speedup_vs_eager", "vs eager"), ("speedup_vs_best_compile", "vs best torch.compile"),
            ("speedup_vs_greedy", "vs greedy plan")]  # fmt: skip
    keys = [(k, label) for k, label in keys if any(r[k] for r in rows)]
    out = ["<p>(matplotlib is not installed: charts drawn as SVG; pip install matplotlib for "
           "PNG charts)</p>", "<h2>Speedup of the tuned plan</h2>"]  # fmt: skip
    out.append(svg.bars([(r["workload"], [r[k] for k, _ in keys]) for r in rows],
                        [label for _, label in keys]))  # fmt: skip
    if _measured_floor(rows):
        out += ["<h2>Roofline floor / tuned time</h2>",
                svg.bars([(r["workload"], [r["fraction_of_floor"]]) for r in rows],
                         ["floor / tuned"], unit="", mark=None)]  # fmt: skip
    out += ["<h2>Optimization history (best µs so far, by trial)</h2>", svg.steps(hists)]
    return out


def main(args: Any) -> int:
    md, page = write_report(args.dir)
    print(f"autofuse report: {md} and {page}")
    return 0
