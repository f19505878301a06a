"""Summarize GPU benchmark JSONs into one table (markdown) and a plot.

    python -m experiments.bench.summarize results/h200/*.json --out results/h200/summary

For each workload the newest run that measured it is used (later files on the command line win).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ORDER = ["pointwise", "seed_reduction", "softmax", "layernorm", "rmsnorm_residual", "sin_cos",
         "gemm_bias_gelu", "swiglu", "mlp_block", "attention_scores",
         "attention_scores_causal"]  # fmt: skip
DEFAULT = "torch.compile default"
MAX = "torch.compile max-autotune-no-cudagraphs"


def latest(paths: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p in paths:
        doc = json.loads(Path(p).read_text())
        for w in doc.get("workloads", []):
            if "error" not in w and MAX in w.get("times_s", {}):
                out[w["workload"]] = {**w, "file": Path(p).name}
    return out


def table(rows: dict[str, dict]) -> str:
    head = ("| workload | run | floor us | eager us | compile default us | max-autotune us | "
            "greedy us | tuned us | tuned vs best compile | tuned vs max-autotune | tuned / floor | "
            "tuned vs greedy | max rel err | TFLOP/s tuned (max-autotune) |")  # fmt: skip
    lines = [head, "|" + "---|" * 14]
    ratios = []
    for name in ORDER:
        if name not in rows:
            continue
        w, t = rows[name], rows[name]["times_s"]
        best = min(t[m] for m in (DEFAULT, MAX) if m in t)
        r = best / t["autofuse tuned"]
        ratios.append(r)
        lines.append(
            f"| {name} | {w['file']} | {w['floor_s'] * 1e6:.1f} | {t['eager'] * 1e6:.1f} | "
            f"{t.get(DEFAULT, float('nan')) * 1e6:.1f} | {t[MAX] * 1e6:.1f} | {t['autofuse greedy'] * 1e6:.1f} | "
            f"{t['autofuse tuned'] * 1e6:.1f} | {r:.2f}x | {t[MAX] / t['autofuse tuned']:.2f}x | "
            f"{w['floor_s'] / t['autofuse tuned']:.2f} | "
            f"{t['autofuse greedy'] / t['autofuse tuned']:.2f}x{_same(w)} | "
            f"{w['max_rel_err_vs_fp64']['autofuse tuned']:.1e} | {_tflops(w)} |"
        )
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"\ngeomean of tuned vs the better torch.compile mode: {geo:.3f}x "
                     f"over {len(ratios)} workloads")  # fmt: skip
    return "\n".join(lines)


def _same(w: dict) -> str:
    """The tuned plan is the greedy one: the two timings differ by noise alone."""
    return " (same plan)" if w.get("same_plan_as_greedy") else ""


def _tflops(w: dict) -> str:
    if not w.get("flops"):
        return "-"
    t = w["times_s"]
    return f"{w['flops'] / t['autofuse tuned'] / 1e12:.0f} ({w['flops'] / t[MAX] / 1e12:.0f})"


def plot(rows: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ORDER if n in rows]
    variants = ["eager", DEFAULT, MAX, "autofuse greedy", "autofuse tuned"]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.16
    for k, v in enumerate(variants):
        vals = [rows[n]["floor_s"] / rows[n]["times_s"].get(v, float("inf")) for n in names]
        ax.bar([i + (k - 2) * width for i in range(len(names))], vals, width, label=v)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("fraction of the roofline floor (higher is better)")
    ax.set_title("H200, bf16: measured time vs max(bytes / copy BW, flops / bf16 mm rate)")
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--out", default="results/h200/summary")
    a = p.parse_args()
    rows = latest(a.files)
    out = Path(a.out)
    out.with_suffix(".md").write_text(table(rows) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(table(rows))


if __name__ == "__main__":
    main()
