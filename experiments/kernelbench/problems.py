"""KernelBench problems read by path (data, never copied), and the CPU mode's shape reduction.

A problem file defines ``Model``, ``get_inputs()`` and ``get_init_inputs()``; its module-level
assignments of integers (literals or arithmetic on literals, ``16384 * 4``) are the problem's
shapes. The reduction rewrites those literals
before the file runs (an AST pass over the assignments alone), so shapes derived from them
(``input_shape = (num_classes,)``, ``groups = in_channels``) stay coupled. Each stage caps:

- ``batch_size`` / ``batch`` to the stage's batch;
- spatial names (``height``, ``width``, ``length``, ``seq_len``, ``image_size``, ``dim1``, ``dim2``,
  ``H``, ``W``, ...) to the stage's spatial cap, a volume's ``depth`` / ``D`` to its depth cap
  (``depth, height, width = 16, 32, 32`` counts as three assignments);
- every other integer above the stage's size cap (channels, features, hidden sizes, classes,
  matrix sizes) to that cap; elements of tuples and lists likewise. Small integers (kernel
  sizes, strides, paddings, dilations, groups, reduced dims, layer counts) and floats stay;
- integers above the size cap that are equal as shipped stay equal (each takes the smallest cap
  of its equals: a ``batch_size`` and a feature size of 32768 that broadcast together).

Stages, tried in order until eager runs the problem: ``small`` (batch 2, spatial <= 12, depth <=
6, sizes <= 16), ``medium`` (batch 2, spatial <= 32, depth <= 16, sizes <= 64: patch sizes, group
counts or linear layers sized for the shipped input), ``divided`` (medium's batch and spatial
caps; the sizes above 64 each divided by one common factor of theirs, the smallest that brings
the largest to 64 or below, so channel counts keep their ratios and their divisibility by group
counts: ShuffleNet's 240 / 480 channels in 3 groups), ``batch`` (batch 2 only) and ``shipped``
(as published).
The record names the stage and every value changed.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BATCH_NAMES = frozenset({"batch_size", "batch"})
SPATIAL_NAMES = frozenset({
    "height", "width", "length", "height_in", "width_in", "seq_len", "seq_length",
    "sequence_length", "image_size", "image_height", "image_width", "max_seqlen", "dim1", "dim2",
    "input_length", "H", "W", "L",
})  # fmt: skip
DEPTH_NAMES = frozenset({"depth", "depth_in", "D"})


@dataclass(frozen=True)
class Stage:
    name: str
    batch: int | None
    spatial: int | None
    size: int | None
    depth: int | None = None
    divide: bool = False  # sizes above ``size`` divided by ``factor``, not capped
    factor: int = 1  # set for each problem by load_module where ``divide``


STAGES = (
    Stage("small", 2, 12, 16, 6),
    Stage("medium", 2, 32, 64, 16),
    Stage("divided", 2, 32, 64, 16, divide=True),
    Stage("batch", 2, None, None),
    Stage("shipped", None, None, None),
)
BY_STAGE = {s.name: s for s in STAGES}


@dataclass(frozen=True)
class Problem:
    level: int
    number: int
    name: str
    path: Path

    @property
    def key(self) -> str:
        """``L<level>_<number>_<name>``: the record's name (a file name)."""
        return f"L{self.level}_{self.number}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.name)}"


def level_dir(root: str | Path, level: int) -> Path:
    """``root/KernelBench/level<N>`` (a checkout of the benchmark), or ``root/level<N>``."""
    root = Path(root)
    for cand in (root / "KernelBench" / f"level{level}", root / f"level{level}"):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"kernelbench: no level{level} folder under {root}")


def discover(root: str | Path, level: int, wanted: set[int] | None = None) -> list[Problem]:
    """The level's problems (``<number>_<name>.py``) by number; ``wanted`` filters numbers."""
    out = []
    for p in level_dir(root, level).glob("*.py"):
        m = re.match(r"^(\d+)_(.+)\.py$", p.name)
        if m and (wanted is None or int(m.group(1)) in wanted):
            out.append(Problem(level, int(m.group(1)), m.group(2), p))
    return sorted(out, key=lambda q: q.number)


def parse_numbers(text: str) -> set[int] | None:
    """``"1-20,33"`` -> {1..20, 33}; empty -> None (all). A bad item raises naming it."""
    if not text:
        return None
    out: set[int] = set()
    for item in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"--problems: {item!r} is not a number or a range a-b")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"--problems: range {item!r} runs backwards")
        out.update(range(lo, hi + 1))
    return out


def cap(names: list[str], value: int, stage: Stage) -> int:
    """The reduced value of an integer assigned to ``names`` (the smallest cap any name has)."""
    caps = []
    for n in names:
        if n in BATCH_NAMES:
            caps.append(stage.batch)
        elif n in DEPTH_NAMES:
            caps.append(stage.depth)
        elif n in SPATIAL_NAMES:
            caps.append(stage.spatial)
        elif value > (stage.size or value):
            caps.append(value // stage.factor if stage.divide else stage.size)
    caps = [c for c in caps if c is not None]
    return min([value, *caps]) if value > 0 else value


def _ints(names: list[str], value: Any) -> list[tuple[list[str], int]]:
    """The integers of an assigned value with the names that decide their caps."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [(names, value)]
    if isinstance(value, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return [(["_element"], v) for v in value]
    return []


def reduce_value(names: list[str], value: Any, stage: Stage, same: dict[int, int]) -> Any:
    """``value`` with each integer capped; an integer above the stage's size cap becomes
    ``same[value]``, the smallest cap of any equal integer of the problem (sizes equal as
    shipped stay equal: ``batch_size = 32768`` and ``input_shape = (32768,)`` broadcast)."""

    def one(ns: list[str], v: int) -> int:
        new = cap(ns, v, stage)
        return min(new, same.get(v, new)) if v > (stage.size or v) else new

    if not _ints(names, value):
        return value
    if isinstance(value, int):
        return one(names, value)
    return type(value)(one(["_element"], v) for v in value)


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a**b}  # fmt: skip


def constant(node: ast.expr) -> Any:
    """The value of a literal or of arithmetic on literals (``16384 * 4``); ValueError where the
    expression names anything (a shape derived from others stays an expression)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str)):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [constant(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = constant(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](constant(node.left), constant(node.right))
    raise ValueError("not a constant expression")


def _split_unpacking(tree: ast.Module) -> None:
    """``depth, height, width = 16, 32, 32`` as one assignment per name (same values)."""
    body: list[ast.stmt] = []
    for node in tree.body:
        t = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        v = node.value if t is not None else None
        if (isinstance(t, (ast.Tuple, ast.List)) and isinstance(v, (ast.Tuple, ast.List))
                and len(t.elts) == len(v.elts) and all(isinstance(e, ast.Name) for e in t.elts)
                and not any(isinstance(e, ast.Starred) for e in v.elts)):  # fmt: skip
            body += [ast.copy_location(ast.Assign(targets=[n], value=e), node)
                     for n, e in zip(t.elts, v.elts)]  # fmt: skip
        else:
            body.append(node)
    tree.body = body


def _assignments(tree: ast.Module):
    """(node, target names, value) of each module-level assignment of a constant expression."""
    _split_unpacking(tree)
    for node in tree.body:  # module level only: the shapes, never code inside functions
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        try:
            value = constant(node.value)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            continue
        if len(names) == len(targets):
            yield node, names, value


def common_factor(values: list[int], limit: int) -> int | None:
    """The smallest divisor of the values' greatest common divisor that brings the largest to
    ``limit`` or below; None where none does."""
    g = math.gcd(*values)
    return next((f for f in range(-(-max(values) // limit), g + 1) if g % f == 0), None)


def _divided(stage: Stage, found: list) -> Stage:
    """``stage`` with the factor that divides this problem's sizes (ValueError where no common
    factor does, or nothing is above the cap: the stage would repeat ``medium``)."""
    sizes = [v for _, names, value in found for ns, v in _ints(names, value)
             if v > stage.size and not set(ns) & (BATCH_NAMES | SPATIAL_NAMES | DEPTH_NAMES)]  # fmt: skip
    factor = common_factor(sizes, stage.size) if sizes else None
    if factor is None:
        raise ValueError(f"stage {stage.name!r}: no common factor of the sizes {sorted(set(sizes))}"
                         f" brings them to {stage.size} or below")  # fmt: skip
    return dataclasses.replace(stage, factor=factor)


def load_module(problem: Problem, stage: Stage) -> tuple[types.ModuleType, dict]:
    """The problem's module with its shapes reduced by ``stage``, and the values changed."""
    tree = ast.parse(problem.path.read_text(), filename=str(problem.path))
    found = list(_assignments(tree))
    stage = _divided(stage, found) if stage.divide else stage
    same: dict[int, int] = {}
    for _, names, value in found:
        for ns, v in _ints(names, value):
            same[v] = min(same.get(v, v), cap(ns, v, stage))
    changed = {}
    for node, names, old in found:
        new = reduce_value(names, old, stage, same)
        if new != old:
            node.value = ast.copy_location(ast.parse(repr(new), mode="eval").body, node.value)
            changed.update({n: [repr(old), repr(new)] for n in names})
    ast.fix_missing_locations(tree)
    module = types.ModuleType(f"kernelbench_{problem.key}")
    module.__file__ = str(problem.path)
    exec(compile(tree, str(problem.path), "exec"), module.__dict__)  # noqa: S102 - problem data
    return module, changed


def instantiate(module: types.ModuleType, seed: int = 0, dtype: Any = None, device: str = "cpu"):
    """``Model(*get_init_inputs())`` and ``get_inputs()`` under fixed seeds, on ``device``;
    floating parameters and inputs cast to ``dtype`` where given. The module keeps the mode it
    is made in (training, as the benchmark runs it: batch norms use the batch's statistics)."""
    import torch

    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
    torch.manual_seed(seed)
    inputs = list(module.get_inputs())
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    return model, [cast(x, dtype, device) for x in inputs]


def new_inputs(module: types.ModuleType, seed: int, dtype: Any = None, device: str = "cpu"):
    """Fresh ``get_inputs()`` under ``seed`` (KernelBench checks several input draws)."""
    import torch

    torch.manual_seed(seed)
    return [cast(x, dtype, device) for x in module.get_inputs()]


def cast(x: Any, dtype: Any, device: str) -> Any:
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    x = x.to(device)
    return x.to(dtype) if dtype is not None and x.is_floating_point() else x
