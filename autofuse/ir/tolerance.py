"""When a computed value agrees with a reference: tolerances by dtype and the comparison every
check uses (a candidate kernel against float64 eager, ``measure/verify.py``; a plan variant
against the plan, ``plan/library_fusion.py``)."""

from __future__ import annotations

import torch

__all__ = ["TOLERANCES", "compare"]

# (relative to max |ref|, absolute)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-10),
    "float32": (1e-4, 1e-5),
    "float16": (5e-3, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: str | None,
    k: int,
    eager: torch.Tensor | None = None,
) -> str | None:
    """None when ``out`` matches the float64 reference ``ref`` within tolerance, else why.

    With ``eager`` (eager's own result in the graph's dtypes), an error up to twice eager's
    own distance from ``ref`` is accepted too: a sum that cancels to near zero, then divides,
    is ill-conditioned in float32 for eager as for any kernel."""
    if tuple(out.shape) != tuple(ref.shape):
        return f"wrong result: output {k} has shape {list(out.shape)}, expected {list(ref.shape)}"
    if not out.is_floating_point():
        ref = ref.to(out.dtype)
        if not torch.equal(out, ref):
            bad = int((out != ref).sum().item())
            return f"wrong result: {bad} of {out.numel()} elements differ on output {k} (exact)"
        return None
    rtol, atol = TOLERANCES.get(dtype or "", TOLERANCES["float32"])
    # a reference value beyond the output dtype's range is the infinity eager stores there
    o, r = out.double(), ref.double()
    big = torch.finfo(out.dtype).max
    r = torch.where(r.abs() > big, ref.to(out.dtype).double(), r)
    o_nan, r_nan = torch.isnan(o), torch.isnan(r)
    if not torch.equal(o_nan, r_nan):
        extra = int((o_nan & ~r_nan).sum().item())
        missing = int((r_nan & ~o_nan).sum().item())
        if extra:
            return (
                f"wrong result: NaN at {extra} positions where the reference has none on "
                f"output {k} (unwritten or invalid elements)"
            )
        return f"wrong result: {missing} values where the reference is NaN on output {k}"
    r_inf = torch.isinf(r)
    if not torch.equal(o[r_inf], r[r_inf]) or bool(torch.isinf(o[~r_inf & ~r_nan]).any()):
        return f"wrong result: infinities differ from the reference on output {k}"
    finite = torch.isfinite(r)
    if not bool(finite.any()):
        return None
    scale = r[finite].abs().max().item()
    err = (o[finite] - r[finite]).abs().max().item()
    allowed = rtol * scale + atol
    if eager is not None and eager.shape == ref.shape:
        e = eager.double()
        if torch.equal(torch.isfinite(e), finite):  # eager overflowed nowhere the ref did not
            allowed = max(allowed, 2.0 * (e[finite] - r[finite]).abs().max().item())
    if err > allowed:
        rel = err / (scale + 1e-30)
        return f"wrong result: max rel err {rel:.3g} > {rtol:g} on output {k}"
    return None
