"""A fuzzed program as data: its inputs, its ops (each one line of Python source) and its
outputs; the source of ``make_inputs`` / ``program`` built from it, and running that source.

The same source runs in the fuzzer, in the shrinker and in a written reproduction, so what
fails in one fails in the others.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

LAYOUTS = ("contiguous", "transposed", "sliced", "channels_last")
KINDS = ("randn", "int", "bool", "index")


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: ``kind`` randn (a float dtype), int (values in [-4, 4]), bool or index
    (int64 in [0, hi)); ``layout`` how its strides are made; ``seed`` its values."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "randn"
    layout: str = "contiguous"
    seed: int = 0
    hi: int = 1


@dataclass(frozen=True)
class OpNode:
    """``out = template.format(*args)``: one op form applied to earlier values."""

    out: str
    form: str
    template: str
    args: tuple[str, ...]

    def expr(self) -> str:
        return self.template.format(*self.args)


@dataclass(frozen=True)
class Program:
    inputs: tuple[InputSpec, ...]
    ops: tuple[OpNode, ...]
    outputs: tuple[str, ...]

    def forms(self) -> list[str]:
        return sorted({op.form for op in self.ops})

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> Program:
        inputs = tuple(InputSpec(**{**s, "shape": tuple(s["shape"])}) for s in d["inputs"])
        ops = tuple(OpNode(**{**o, "args": tuple(o["args"])}) for o in d["ops"])
        return Program(inputs, ops, tuple(d["outputs"]))


def input_expr(s: InputSpec, on_device: bool = False) -> str:
    """The expression that makes input ``s`` (with ``g`` a generator seeded for it); with
    ``on_device`` its values, drawn on the CPU, are moved to ``device`` before the layout is
    made (so a GPU run gets the CPU run's values in the same strides)."""
    shape = list(s.shape)
    if s.layout == "transposed":
        shape[-2], shape[-1] = shape[-1], shape[-2]
    elif s.layout == "sliced":
        shape[-1] *= 2
    size = repr(tuple(shape))
    if s.kind == "randn":
        e = f"torch.randn({size}, generator=g).to(torch.{s.dtype})"
    elif s.kind == "int":
        e = f"torch.randint(-4, 5, {size}, generator=g).to(torch.{s.dtype})"
    elif s.kind == "bool":
        e = f"(torch.rand({size}, generator=g) < 0.5)"
    else:
        e = f"torch.randint(0, {max(s.hi, 1)}, {size}, generator=g)"
        if s.dtype != "int64":
            e += f".to(torch.{s.dtype})"
    if on_device:
        e += ".to(device)"
    if s.layout == "transposed":
        e += ".transpose(-2, -1)"
    elif s.layout == "sliced":
        e += "[..., ::2]"
    elif s.layout == "channels_last":
        e += ".contiguous(memory_format=torch.channels_last)"
    return e


def inputs_source(p: Program) -> str:
    lines = ['def make_inputs(device="cpu"):', "    g = torch.Generator()"]
    for s in p.inputs:
        lines += [f"    g.manual_seed({s.seed})", f"    {s.name} = {input_expr(s, True)}"]
    lines.append(f"    return [{', '.join(s.name for s in p.inputs)}]")
    return "\n".join(lines) + "\n"


def program_source(p: Program) -> str:
    lines = [f"def program({', '.join(s.name for s in p.inputs)}):"]
    lines += [f"    {op.out} = {op.expr()}" for op in p.ops]
    outs = ", ".join(p.outputs) + ("," if len(p.outputs) == 1 else "")
    lines.append(f"    return ({outs})")
    return "\n".join(lines) + "\n"


def namespace(torch_module: Any = torch) -> dict[str, Any]:
    """The globals the source runs with (a test may pass a stand-in for ``torch``)."""
    return {"torch": torch_module, "F": F, "math": math}


def compile_program(
    p: Program, torch_module: Any = torch
) -> tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]:
    """(program, make_inputs) as functions, from the program's source."""
    ns = namespace(torch_module)
    exec(compile(inputs_source(p), "<fuzz inputs>", "exec"), namespace(), ns)
    exec(compile(program_source(p), "<fuzz program>", "exec"), ns)
    return ns["program"], ns["make_inputs"]


def used_names(p: Program) -> set[str]:
    """Names some op or output reads."""
    return {a for op in p.ops for a in op.args} | set(p.outputs)


def without_dead(p: Program) -> Program:
    """Ops no output depends on, and inputs nothing reads, removed."""
    live = set(p.outputs)
    ops = []
    for op in reversed(p.ops):
        if op.out in live:
            ops.append(op)
            live |= set(op.args)
    inputs = tuple(s for s in p.inputs if s.name in live)
    return Program(inputs, tuple(reversed(ops)), p.outputs)


def rename_uses(p: Program, old: str, new: str) -> Program:
    """Every read of ``old`` (after its definition) reads ``new`` instead."""
    ops = tuple(replace(op, args=tuple(new if a == old else a for a in op.args)) for op in p.ops)
    outs = tuple(dict.fromkeys(new if o == old else o for o in p.outputs))
    return Program(p.inputs, ops, outs)


def value_flags(p: Program) -> tuple[str, ...]:
    """("size-0",) where some value of ``p`` in eager is empty, ("size-1",) where some value
    has a dim of size 1 (and neither is empty), else ()."""
    try:
        fn, make_inputs = compile_program(p)
        env = dict(zip((s.name for s in p.inputs), make_inputs()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for op in p.ops:
                env[op.out] = eval(op.expr(), namespace(), env)
    except Exception:  # noqa: BLE001 - eager rejects it: no flags
        return ()
    values = [t for t in env.values() if isinstance(t, torch.Tensor)]
    if any(t.numel() == 0 for t in values):
        return ("size-0",)
    return ("size-1",) if any(1 in t.shape for t in values) else ()
