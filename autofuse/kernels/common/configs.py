"""Launch-config records and checks shared by several kinds: the loop kernels' config (pointwise,
reduction, scan, scatter), the power-of-two check, the shared memory a block may take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autofuse.settings import HOPPER

HOPPER_SMEM_BYTES = HOPPER.smem_bytes  # max dynamic shared memory per block on H100/H200


@dataclass(frozen=True, order=True)
class KernelConfig:
    """Launch parameters of a loop kernel (pointwise or reduction): XBLOCK elements (or rows)
    per program, RBLOCK reduced elements per step (0 for pointwise kernels), num_warps."""

    SWITCHES: ClassVar[tuple[str, ...]] = (
        "HOIST",
        "ONE_STAGE",
    )  # on/off: the search and the polish switch them
    XBLOCK: int
    RBLOCK: int = 0
    num_warps: int = 4
    # persistent reductions: issue every load at the top of the kernel, so the loads used only
    # after a reduction (a norm's weight and bias) are in flight while it runs
    HOIST: bool = False
    # looped reductions: launch with num_stages=1 (no software pipelining of the column loop's
    # loads, as Inductor launches its reductions) instead of Triton's default
    ONE_STAGE: bool = False

    def label(self) -> str:
        r = f" RBLOCK={self.RBLOCK}" if self.RBLOCK else ""
        flags = "".join(f" {f}" for f in ("HOIST", "ONE_STAGE") if getattr(self, f))
        return f"XBLOCK={self.XBLOCK}{r} num_warps={self.num_warps}{flags}"


def check_pow2(**values: int) -> None:
    for label, v in values.items():
        if v < 1 or v & (v - 1):
            raise ValueError(f"{label} must be a power of two, got {v}")
