"""A search's record (:class:`TuneResult`): the winning plan, its time and the baselines beside
it. Its own module, free of Optuna, so that a cache hit's record (``tune/entry.py``) is made
without importing the tuner."""

from __future__ import annotations

from dataclasses import dataclass, field

from autofuse.plan.steps import Plan

__all__ = ["TuneResult"]


@dataclass
class TuneResult:
    plan: Plan
    value: float  # the winner's cost (sum of kernels, or end-to-end when re-timed)
    source: str
    greedy_value: float | None
    unfused_value: float | None
    eager_value: float | None
    trials: int
    failed: int
    seconds: float
    kernel_times: dict[str, tuple[float, str]] = field(default_factory=dict)
    study_name: str = ""
    end_to_end: dict[str, float] = field(default_factory=dict)
    library_value: float | None = None  # matmuls by torch (cuBLAS), their epilogues fused
    pruned: int = 0  # sampled partitions the cost model ruled out unbuilt (tune/prune.py)
    cached: bool = False  # read back from the cache entry (tune/entry.py), not tuned now

    def summary(self) -> str:
        unit = "modeled" if self.source == "modeled" else "measured"
        pruned = f", {self.pruned} pruned by the cost model" if self.pruned else ""
        run = f"{self.trials} trials ({self.failed} failed{pruned}) in {self.seconds:.1f} s"
        if self.cached:
            run = f"from the cache: tuned earlier with {self.trials} trials"
        lines = [
            f"tuned plan: {len(self.plan.kernels)} kernels, {len(self.plan.fallbacks)} eager ops, "
            f"{self.value * 1e6:.2f} us ({unit}); {run}, study {self.study_name}",
        ]
        baselines = (
            ("greedy plan", self.greedy_value, unit),
            ("cuBLAS + fused epilogues", self.library_value, unit),
            ("unfused plan", self.unfused_value, unit),
            ("eager PyTorch", self.eager_value, "measured"),
        )
        for label, value, source in baselines:
            if value:
                lines.append(f"  vs {label}: {value * 1e6:.2f} us "
                             f"({value / self.value:.2f}x, {source})")  # fmt: skip
        return "\n".join(lines)
