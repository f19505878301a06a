"""The attention backward kernel's reads (``common/reads.py``), for its cost facts: each program
role (a block of keys, a block of query rows) walks its loops over the other side's tiles; each
loop recomputes the gradients' tile operands from their loads (the tile matmuls' operand the
role holds is loaded once, before its first loop) and reads each gradient's loaded operand. On
the whole tiles of a mask with exact limits (``whole``) the mask passes its input: the
condition is not read there. The dots are one tile's (the loops repeat the same ones)."""

from __future__ import annotations

from typing import Any

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.attention_bwd.analysis import BwdParts, backward_facts, tile_index
from autofuse.kernels.attention_bwd.skip import SkipPlan, skip_plan
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.reads import CONSTANT, Reads


class BwdReads(Reads):
    def __init__(self, graph: Graph, info: GroupInfo, parts: BwdParts, skip: SkipPlan | None):
        super().__init__(graph, info, True)
        self.parts, self.skip = parts, skip
        self.role, self.held, self.pass_tile = "", set(), False

    def replaced(self, i: int) -> int | None:
        s = self.skip
        if self.pass_tile and s is not None:
            if i == s.select:
                return s.passed
            if i == s.cond:
                return CONSTANT
        return None

    def reduced(self, i: int) -> None:
        """A tile matmul: ``tl.dot`` of its operands (the one the role holds loaded once)."""
        a, b = self.g[i].inputs
        self.operand(a, self.role == "q")
        self.operand(b, self.role == "kv")
        self.dots += 1

    def operand(self, j: int, fixed: bool) -> None:
        if fixed and j in self.held:
            return
        if fixed:
            self.held.add(j)
        self.read(self.parts.operand_base(self.g, j))

    def accumulate(self, grads: list) -> None:
        for gm in grads:
            self.value(gm.tile)
            self.operand(gm.loaded(self.g), False)
            self.dots += 1

    def role_loops(self, role: str, grads: list, whole: bool) -> None:
        """The role's loops; the dots of its first alone."""
        self.role, self.held = role, set()
        s = self.skip
        passes = [False]
        if s is not None and role == "kv":
            passes = ([False, True, False] if s.exact and whole else [False]) + [False, False]
        dots = None
        for pass_tile in passes:
            self.pass_tile = pass_tile
            self.loop(lambda: self.accumulate(grads))
            dots = self.dots if dots is None else dots
            self.dots = dots
        self.pass_tile = False


def bwd_reads(graph: Graph, info: GroupInfo, config: Any) -> tuple[tuple[int, ...], int]:
    """(load passes, dots) of the attention backward kernel of ``info`` under ``config``."""
    p = backward_facts(graph, frozenset(info.nodes))
    rows, keys = Expr.dim("xindex", 1, p.t, True), Expr.dim("rindex", 1, p.tk, True)
    skip = skip_plan(graph, info, p, tile_index(p.domain, p.heads, len(p.domain), rows, keys))
    reads = BwdReads(graph, info, p, skip)
    for role, over_rows in (("kv", True), ("q", False)):
        grads = [gm for gm in p.grads if gm.over_rows == over_rows]
        if grads:
            reads.role_loops(role, grads, config.whole)
    return reads.passes(), reads.dots
