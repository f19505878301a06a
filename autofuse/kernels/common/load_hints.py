"""How a loop kernel reads memory beyond the plain ``tl.load``: which lanes need no read at
all, and which reads stream through the cache.

- **Selective loads.** ``where(c, x, const)`` (``masked_fill(~tril, finfo.min)``, a padding
  mask) only uses ``x`` on the lanes ``c`` selects: when ``x`` is a loaded buffer that nothing
  else in the kernel reads, its loads are masked by ``c`` too, so the other lanes read nothing
  (a causal mask halves the scores read). The constant is still taken from the ``where``: the
  value is eager's on every lane, whatever the unread memory holds (NaN included).
- **Streamed loads.** A looped reduction that reads a buffer in one column loop alone loads it
  ``evict_first``: it is not read again, and what later loops re-read stays in L2.
- **Kept loads.** A broadcast buffer (fewer elements than the kernel's domain: RoPE's cos/sin
  read once per head, a position table once per batch row) is loaded ``evict_last``: other
  programs read the same lines again, later, after the streamed traffic of a whole head or row
  has gone through L2.
"""

from __future__ import annotations

from typing import Any

from autofuse.ir.graph import numel
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.indexed import guarded
from autofuse.kernels.common.render import Val, cast, compute_dtype, render_op
from autofuse.kernels.common.views import broadcast_index


def select_branch(em: Any, i: int) -> int | None:
    """For ``where(c, a, b)`` with one branch a constant and the other a value loaded from
    memory for this ``where`` alone: the position (1 or 2) of the loaded branch, else None."""
    g = em.g
    node = g[i]
    if node.op != "where":
        return None
    for pos, other in ((1, 2), (2, 1)):
        j, k = node.inputs[pos], node.inputs[other]
        base = g.base_of(j)
        if (
            g[g.base_of(k)].op == "const"
            and base not in em.members
            and g[base].op not in ("const", "iota")
            and [u for u in g.compute_users[base] if u in em.members] == [i]
        ):
            return pos
    return None


def guarded_where(em: Any, i: int, index: tuple[Expr, ...], pos: int) -> Val:
    """``where`` node ``i`` at ``index``, its branch ``pos`` loaded only on the lanes that
    select it."""
    g = em.g
    node = g[i]
    at = [broadcast_index(g[j].shape, node.shape, index) for j in node.inputs]
    cond = em.value(node.inputs[0], at[0])
    args: list[Val] = [cond]
    for p in (1, 2):
        j = node.inputs[p]
        if p != pos or cond.cls == 0:
            args.append(em.value(j, at[p]))
            continue
        c = cast(cond, "bool")
        em.selective.add(g.base_of(j))
        guard = f"({c})" if pos == 1 else f"({c} == 0)"
        args.append(guarded(em, guard, cond.cls, lambda j=j, p=p: em.value(j, at[p])))
    expr = render_op(node.op, node, args, em.helpers)
    return em.tmp(expr, max(v.cls for v in args), compute_dtype(node.dtype), node.name)


def selective_loads(em: Any) -> tuple[int, ...]:
    """Positions in ``info.loads`` of the buffers read only where a ``where`` selects them."""
    return tuple(k for k, i in enumerate(em.info.loads) if i in em.selective)


def kept(em: Any, i: int) -> bool:
    """The loaded node ``i`` is broadcast over the kernel's domain (re-read by other programs)
    and not streamed: it is loaded ``evict_last``."""
    return i not in em.streamed and numel(em.g[i].shape) < numel(em.info.domain)


def kept_loads(em: Any) -> tuple[int, ...]:
    """Positions in ``info.loads`` of the buffers loaded ``evict_last``."""
    return tuple(k for k, i in enumerate(em.info.loads) if kept(em, i))


def eviction(em: Any, i: int) -> str:
    """The ``tl.load`` keyword for node ``i``'s cache policy ('' for the default)."""
    if i in em.streamed and em.region:
        return ", eviction_policy='evict_first'"
    if kept(em, i):
        return ", eviction_policy='evict_last'"
    return ""


def meta_fields(em: Any) -> dict[str, tuple[int, ...]]:
    """The ``KernelMeta`` fields these hints fill for an emitted kernel."""
    return {"selective_loads": selective_loads(em), "kept_loads": kept_loads(em)}
