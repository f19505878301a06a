"""A failing program reduced while it still fails the same way: outputs dropped, ops bypassed
(an op's readers read one of its arguments instead), input dims shrunk toward 1 and 2, index
bounds lowered, layouts made contiguous and 16-bit inputs made float32. Greedy: the first
smaller candidate that still fails is taken and the walk starts again, until no candidate
fails, the time budget is spent or the checks run out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from experiments.fuzz.program import InputSpec, Program, rename_uses, without_dead


@dataclass(frozen=True)
class Shrunk:
    program: Program
    checks: int
    accepted: int
    seconds: float
    complete: bool  # no candidate of the result fails (not cut short by the budget)


def with_input(p: Program, k: int, spec: InputSpec) -> Program:
    return Program(p.inputs[:k] + (spec,) + p.inputs[k + 1 :], p.ops, p.outputs)


def candidates(p: Program) -> Iterator[Program]:
    """Smaller programs than ``p``, the largest reductions first."""
    if len(p.outputs) > 1:
        for o in p.outputs:
            yield without_dead(Program(p.inputs, p.ops, tuple(x for x in p.outputs if x != o)))
    for k in reversed(range(len(p.ops))):
        op = p.ops[k]
        rest = Program(p.inputs, p.ops[:k] + p.ops[k + 1 :], p.outputs)
        for a in dict.fromkeys(op.args):
            yield without_dead(rename_uses(rest, op.out, a))
    yield from _input_candidates(p)


def _input_candidates(p: Program) -> Iterator[Program]:
    for k, s in enumerate(p.inputs):
        for d, size in enumerate(s.shape):
            for target in (1, 2):
                if target < size:
                    shape = s.shape[:d] + (target,) + s.shape[d + 1 :]
                    yield with_input(p, k, replace(s, shape=shape))
        if s.kind == "index" and s.hi > 1:
            yield with_input(p, k, replace(s, hi=1))
        if s.layout != "contiguous":
            yield with_input(p, k, replace(s, layout="contiguous"))
        if s.dtype in ("float16", "bfloat16"):
            yield with_input(p, k, replace(s, dtype="float32"))


def shrink(
    p: Program, fails: Callable[[Program], bool], budget_s: float = 300.0, max_checks: int = 400
) -> Shrunk:
    """The smallest program found from ``p`` for which ``fails`` holds (``fails(p)`` is
    assumed)."""
    t0 = time.monotonic()
    p = without_dead(p)
    checks = accepted = 0
    tried: set[str] = set()
    while True:
        for c in candidates(p):
            key = repr(c)
            if key in tried:
                continue
            if time.monotonic() - t0 > budget_s or checks >= max_checks:
                return Shrunk(p, checks, accepted, round(time.monotonic() - t0, 1), False)
            tried.add(key)
            checks += 1
            if fails(c):
                p, accepted = c, accepted + 1
                break
        else:
            return Shrunk(p, checks, accepted, round(time.monotonic() - t0, 1), True)
