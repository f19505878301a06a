"""Row ops whose value is not the row's combine, rendered inside the loop kernels' emitter.

*Scans* (``cumsum``, ``cumprod``; ``OpDef.scan``): the running combine along the reduced dim,
a value per element of the domain. The row is one block (the ``scan`` kind keeps its kernels
persistent) and is scanned by ``tl.cumsum`` / ``tl.cumprod``; the masked lanes, past the row's end,
hold the identity. *Arg reductions* (``argmax``, ``argmin``; ``OpDef.arg``): the index (int64)
of the row's first max (min), a NaN beating every number as in eager: the lowest index of
the lanes holding the row's max (min), or its NaNs (standard reductions only). Masked lanes hold the identity and an index past every real one, so they
never win a tie. Looped kernels keep one (value, index) pair per lane across the row's chunks
(each lane sees its indices in increasing order) and reduce the lanes at the end.
"""

from __future__ import annotations

from typing import Any

from autofuse.ir.op_helpers import Helper
from autofuse.ir.ops import op_def
from autofuse.kernels.common.base import FusionRefused, describe
from autofuse.kernels.common.render import TL_DTYPE, Val, combine, compute_dtype, identity, is_float

_ARG_DOC = "    # the {w} value wins, a NaN beats every number, ties go to the lower index\n"
ARGMAX = Helper(
    "_af_argmax",
    "@triton.jit\ndef _af_argmax(a, ia, b, ib):\n"
    + _ARG_DOC.format(w="larger")
    + "    win = (a > b) | ((a != a) & (b == b))\n"
    "    tie = (a == b) | ((a != a) & (b != b))\n"
    "    pick = win | (tie & (ia < ib))\n"
    "    return tl.where(pick, a, b), tl.where(pick, ia, ib)\n",
)
ARGMIN = Helper(
    "_af_argmin",
    "@triton.jit\ndef _af_argmin(a, ia, b, ib):\n"
    + _ARG_DOC.format(w="smaller")
    + "    win = (a < b) | ((a != a) & (b == b))\n"
    "    tie = (a == b) | ((a != a) & (b != b))\n"
    "    pick = win | (tie & (ia < ib))\n"
    "    return tl.where(pick, a, b), tl.where(pick, ia, ib)\n",
)
NO_INDEX = "2147483647"  # the index of a masked lane: past every real one
MAX_ROW = 32768  # the longest row a scan kernel holds in one block


def is_row_op(op: str) -> bool:
    d = op_def(op)
    return d.scan or d.arg


def is_scan(op: str) -> bool:
    return op_def(op).scan


def acc_dtype(em: Any, r: int) -> str:
    """A scan accumulates in its output's compute dtype (int64 for integer inputs, or the
    ``dtype=`` asked for: capture casts the input to it); an arg reduction compares values in
    its input's compute dtype."""
    node = em.g[r]
    if op_def(node.op).scan:
        return compute_dtype(node.dtype)
    return compute_dtype(em.g[node.inputs[0]].dtype)


def start_index(em: Any, r: int) -> None:
    """A looped arg reduction's per-lane index accumulator, beside its value accumulator."""
    node = em.g[r]
    if op_def(node.op).scan:
        raise FusionRefused(
            f"{describe(em.g, r)} is a scan: it needs its whole row in one block (RBLOCK >= "
            f"{em.info.rnumel}), got RBLOCK={em.cfg.RBLOCK}"
        )
    if em.info.rnumel >= int(NO_INDEX):
        raise FusionRefused(f"{describe(em.g, r)}: a row of 2**31 elements or more")
    em.arg_index[r] = em.tmp(f"tl.full([XBLOCK, RBLOCK], {NO_INDEX}, tl.int32)", 2, "int32")


def _helper(em: Any, op: str) -> Helper:
    h = ARGMAX if op_def(op).combine == "max" else ARGMIN
    em.helpers.add(h)
    return h


def _lane_index() -> str:
    return f"tl.where(xmask & rmask, rindex, {NO_INDEX})"


def accumulate(em: Any, r: int, acc: Val, val: str) -> None:
    """One chunk of a looped arg reduction into its per-lane (value, index) accumulators."""
    idx = em.arg_index[r]
    h = _helper(em, em.g[r].op)
    em.line(f"{acc.code}, {idx.code} = {h.name}({acc.code}, {idx.code}, {val}, {_lane_index()})")


def finish(em: Any, r: int, acc: Val, acc_dtype: str) -> None:
    """Bind row op ``r``'s value: a scan's per-element prefix, or an arg reduction's row index
    (int64, one per row). ``acc`` holds the masked input (persistent) or the per-lane values
    (looped, with ``em.arg_index[r]``)."""
    node = em.g[r]
    cd = compute_dtype(node.dtype)
    if op_def(node.op).scan:
        expr = _scan(node.op, acc.code)
        if acc_dtype != cd:
            expr = f"({expr}).to({TL_DTYPE[cd]})"
        em.red_val[r] = em.tmp(expr, 2, cd, node.name)
        return
    if r in em.arg_index:
        idx = em.arg_index[r].code
    else:
        if em.info.rnumel >= int(NO_INDEX):
            raise FusionRefused(f"{describe(em.g, r)}: a row of 2**31 elements or more")
        idx = em.tmp(_lane_index(), 2, "int32", node.name + " lane index").code
    pick = _winners(em, node.op, acc.code, acc_dtype)
    i = em.tmp(f"tl.min(tl.where({pick}, {idx}, {NO_INDEX}), 1)[:, None]", 1, "int32").code
    em.red_val[r] = em.tmp(f"{i}.to({TL_DTYPE[cd]})", 1, cd, node.name)


def _winners(em: Any, op: str, acc: str, acc_dtype: str) -> str:
    """The lanes holding the row's winning value: its max (min), or, in a row with a NaN, its
    NaNs. Standard reductions only (a tuple ``tl.reduce`` with a combine function of its own
    runs element by element in Triton's interpreter); the lowest index among them wins."""
    best = em.tmp(f"tl.{'max' if op_def(op).combine == 'max' else 'min'}({acc}, 1)[:, None]", 1,
                  acc_dtype, f"{op} value").code  # fmt: skip
    if not is_float(acc_dtype):
        return f"({acc} == {best})"
    nan = em.tmp(f"tl.max(({acc} != {acc}).to(tl.int32), 1)[:, None] > 0", 1, "bool").code
    return f"tl.where({nan}, {acc} != {acc}, {acc} == {best})"


def _scan(op: str, code: str) -> str:
    """The running combine of ``code`` along the row: ``tl.cumsum`` / ``tl.cumprod`` (Triton's
    own combine functions, which its interpreter runs vectorized)."""
    return f"tl.{'cumsum' if op_def(op).combine == '+' else 'cumprod'}({code}, 1)"


def scanned(em: Any, i: int, index: tuple) -> Val:
    """A scan's value, read at its own element (the block holds no other)."""
    if index != em.full:
        raise FusionRefused(
            f"{describe(em.g, i)} is read at another element than its own: a scan's value is "
            "in the block of its own element only"
        )
    if not em.persistent:
        return _looped_scan(em, i)
    if i not in em.red_val:
        raise FusionRefused(f"{describe(em.g, i)} is read before it is computed")
    return em.red_val[i]


def _looped_scan(em: Any, i: int) -> Val:
    """A scan over a row walked in RBLOCK chunks, in the loop that reads it: each chunk is
    scanned by ``tl.associative_scan`` and combined with the carry (the combine of the row's
    earlier chunks), which the end of each iteration advances by the chunk's combine (the
    last lane of its scan)."""
    node = em.g[i]
    if not em.loops:
        raise FusionRefused(
            f"{describe(em.g, i)} scans a row of {em.info.rnumel} elements in chunks of "
            f"{em.cfg.RBLOCK}: its value exists only inside the chunk loop, not for a row output"
        )
    acc = acc_dtype(em, i)
    _, val = em.masked_input(i)
    v = em.tmp(val, 2, acc, f"{node.name} chunk")
    carry = f"tmp{em.n_tmp}"
    em.n_tmp += 1
    loop = em.loops[-1]
    init = f"tl.full([XBLOCK, 1], {identity(node.op, acc)}, {TL_DTYPE[acc]})"
    loop.before(em, f"{carry} = {init}  # {node.name}: the combine of the earlier chunks")
    s = em.tmp(_scan(node.op, v.code), 2, acc)
    expr = combine(node.op, carry, s.code, acc)
    cd = compute_dtype(node.dtype)
    if acc != cd:
        expr = f"({expr}).to({TL_DTYPE[cd]})"
    # the chunk's combine is its scan's last lane (masked lanes hold the identity)
    zero = "0.0" if is_float(acc) else "0"
    total = f"tl.sum(tl.where(rbase == RBLOCK - 1, {s.code}, {zero}), 1)[:, None]"
    loop.tail.append(f"{carry} = {combine(node.op, carry, total, acc)}")
    return em.tmp(expr, 2, cd, node.name)
