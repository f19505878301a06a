"""experiments/bench/serving.py on CPU: tiny models, a few short lengths, an injected timer (the
kernels run in Triton's interpreter; the timer makes the figures exact, so the regret and the
compile counts can be checked)."""

import json

import pytest

from experiments.bench import serving

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _timer(seconds):
    calls = []

    def timer(fn):
        fn()  # the request runs once more, as a real timer would
        calls.append(1)
        return seconds

    return timer, calls


ARGS = ["--size", "tiny", "--device", "cpu", "--requests", "200", "--lengths", "3",
        "--min-len", "16", "--max-len", "48", "--median", "24", "--sigma", "0.5",
        "--compile-backend", "aot_eager"]  # fmt: skip


def test_trace_strata_and_buckets():
    trace = serving.request_lengths(500, 0, 16, 4096, 384, 1.0)
    assert trace == serving.request_lengths(500, 0, 16, 4096, 384, 1.0)  # seeded
    assert min(trace) >= 16 and max(trace) <= 4096 and len(set(trace)) > 100
    picks = serving.strata_lengths(trace, 8)
    assert sorted(picks) == picks or len(picks) == 8
    s = sorted(trace)
    assert sorted(picks)[0] <= s[len(s) // 8] and sorted(picks)[-1] >= s[len(s) * 7 // 8]
    edges = serving.bucket_edges(16, 4096)
    assert edges == [32, 64, 128, 256, 512, 1024, 2048, 4096]  # 8 buckets over 16-4096
    assert [serving.bucket_of(n, edges) for n in (16, 32, 33, 4096)] == [32, 32, 64, 4096]
    assert serving.bucket_edges(16, 100, [100, 50]) == [50, 100]
    with pytest.raises(ValueError, match="below --max-len"):
        serving.bucket_edges(16, 4096, [64, 128])


def test_bad_arguments_name_the_option(capsys):
    for argv, word in ((["--modes", "eager,fast"], "--modes"), (["--models", "gpt"], "--models"),
                       (["--buckets", "64", "--max-len", "100"], "--buckets"),
                       (["--lengths", "0"], "--lengths")):  # fmt: skip
        with pytest.raises(SystemExit):
            serving.parse_args(argv)
        assert word in capsys.readouterr().err


@pytest.mark.slow
def test_decoder_modes_regret_and_compile_counts(tmp_path):
    timer, calls = _timer(0.002)
    modes = "eager,autofuse_shape,autofuse_bucket,compile_static"
    res = serving.main([*ARGS, "--out", str(tmp_path), "--tag", "t", "--models", "decoder",
                        "--modes", modes], timer=timer)  # fmt: skip
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["stamp"]["torch"] and saved["stamp"]["commit"]
    lengths = res["trace"]["run_lengths"]
    assert len(set(lengths)) == 3, lengths
    edges = res["trace"]["bucket_edges"]
    got = res["models"]["decoder"]["modes"]
    for mode, rec in got.items():
        assert rec["status"] == "ok", (mode, rec)
        assert rec["worst_rel_err"] < 1e-4, (mode, rec)
        assert rec["mean_request_s"] == 0.002
        assert all(v == 0 for v in rec["compiles_after_warmup"].values()), (mode, rec)
    assert got["autofuse_shape"]["compiles"]["autofuse_plans"] == 3  # one plan per length
    assert got["autofuse_shape"]["compiles"]["autofuse_graphs"] == 3
    n_buckets = len({serving.bucket_of(n, edges) for n in lengths})
    assert got["autofuse_bucket"]["compiles"]["autofuse_plans"] == n_buckets < 3
    assert got["autofuse_bucket"]["new_shape_over_steady"] > 0  # a length of a known bucket
    assert got["compile_static"]["compiles"]["dynamo_graphs"] >= 3  # a recompile per length
    assert got["eager"]["compiles"] == {"dynamo_graphs": 0}
    assert res["models"]["decoder"]["regret_vs_autofuse_shape"]["autofuse_bucket"]["mean"] == 0
    assert len(calls) == 3 * len(got)


def test_encoder_pads_with_its_mask_and_a_failing_mode_is_recorded(tmp_path, monkeypatch):
    timer, _ = _timer(0.001)
    res = serving.main([*ARGS, "--out", str(tmp_path), "--models", "encoder", "--lengths", "2",
                        "--modes", "autofuse_bucket,compile_dynamic",
                        "--compile-backend", "no_such_backend"], timer=timer)  # fmt: skip
    got = res["models"]["encoder"]["modes"]
    assert got["autofuse_bucket"]["status"] == "ok"
    assert got["autofuse_bucket"]["worst_rel_err"] < 1e-4  # the padding is masked out
    assert got["compile_dynamic"]["status"].startswith("error"), got["compile_dynamic"]
    saved = json.loads((tmp_path / "serving.json").read_text())  # written after every mode
    assert set(saved["models"]["encoder"]["modes"]) == {"autofuse_bucket", "compile_dynamic"}


def test_dynamic_shapes_bench_counts_a_new_shape(tmp_path):
    from experiments.bench import dynamic_shapes

    res = dynamic_shapes.main(["--out", str(tmp_path), "--cases", "function", "--lengths", "5,6",
                               "--batches", "2", "--reps", "1"])  # fmt: skip
    got = res["function"]
    assert got["wrong"] == 0 and got["partitions_made"] == 1 and got["aot_traces"] == 1, got
    assert got["kernels_built_at_known_buckets"] == 0 and got["new_shape_over_steady"] > 0, got
    assert json.loads((tmp_path / "dynamic_shapes.json").read_text())["function"]["shapes"] == 2
