"""Random small programs, built shape-aware: each op is drawn from the form table for values
whose shapes and dtypes it accepts, and run in eager on the real (small) inputs as it is added;
a draw eager rejects is discarded and counted (``Builder.rejected``).

Adding a form (or changing a weight) changes what every later seed draws: a graph's seed names
its program for one version of the table (the record keeps each failing program itself).

Dims of size 1 are drawn most often (the class of kernels that once went silently wrong), then
0 and small sizes; inputs are contiguous, transposed, sliced (every other element of the last
dim) or channels-last, in float32, float16, bfloat16, int32, int64 or bool.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable, Sequence

import torch

from experiments.fuzz.forms_arith import FORMS_ARITH
from experiments.fuzz.forms_basic import FORMS_BASIC, Form
from experiments.fuzz.forms_more import FORMS_MORE
from experiments.fuzz.forms_order import FORMS_ORDER
from experiments.fuzz.forms_shape import FORMS_SHAPE
from experiments.fuzz.program import (
    InputSpec,
    OpNode,
    Program,
    compile_program,
    input_expr,
    namespace,
)

FORMS: tuple[Form, ...] = FORMS_BASIC + FORMS_MORE + FORMS_ARITH + FORMS_ORDER + FORMS_SHAPE
FORM_NAMES = tuple(f.name for f in FORMS)
DIM_SIZES = (1,) * 10 + (0,) + (2,) * 4 + (3,) * 3 + (4, 4, 5, 7, 8, 8, 16)
DTYPES = ("float32",) * 6 + ("float16", "bfloat16", "int32", "int64", "bool")
MAX_NUMEL = 2048


class Builder:
    """The program being built: its inputs, ops and every value's eager tensor."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.inputs: list[InputSpec] = []
        self.ops: list[OpNode] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self.rejected = 0
        self.counter = 0

    def t(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def values(self) -> list[str]:
        return list(self.tensors)

    def pick(self, pred: Callable[[torch.Tensor], bool] | None = None) -> str | None:
        """A random value (``pred`` holding), later values preferred."""
        names = [n for n in self.tensors if pred is None or pred(self.tensors[n])]
        if not names:
            return None
        return names[-1] if self.rng.random() < 0.4 else self.rng.choice(names)

    def new_input(
        self, shape: tuple[int, ...], dtype: torch.dtype | str, kind: str = "", hi: int = 1
    ) -> str:
        dt = str(dtype).replace("torch.", "")
        if not kind:
            kind = "bool" if dt == "bool" else ("randn" if "float" in dt else "int")
        layout = draw_layout(self.rng, len(shape)) if kind != "index" else "contiguous"
        spec = InputSpec(f"x{len(self.inputs)}", tuple(shape), dt, kind, layout,
                         self.rng.randrange(1 << 16), hi)  # fmt: skip
        g = torch.Generator()
        g.manual_seed(spec.seed)
        self.tensors[spec.name] = eval(input_expr(spec), namespace(), {"g": g})
        self.inputs.append(spec)
        return spec.name

    def try_add(self, form: Form) -> bool:
        """Draw ``form`` and run it on the values; False (counted) where eager rejects it."""
        n_inputs = len(self.inputs)
        try:
            drawn = form.draw(self.rng, self)
            if drawn is None:
                return False
            template, args = drawn
            op = OpNode(f"v{self.counter}", form.name, template, tuple(args))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = eval(op.expr(), namespace(), dict(self.tensors))
            if not isinstance(out, torch.Tensor) or out.numel() > MAX_NUMEL:
                raise ValueError("not a small tensor")
        except Exception:  # noqa: BLE001 - eager rejects the draw: discarded, counted
            self.rejected += 1
            for s in self.inputs[n_inputs:]:
                del self.tensors[s.name]
            del self.inputs[n_inputs:]
            return False
        self.counter += 1
        self.ops.append(op)
        self.tensors[op.out] = out
        return True


def draw_shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((1, 2, 2, 3, 3, 4))
    while True:
        shape = tuple(rng.choice(DIM_SIZES) for _ in range(rank))
        if _numel(shape) <= 256:
            return shape


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def draw_layout(rng: random.Random, rank: int) -> str:
    r = rng.random()
    if r < 0.15 and rank >= 2:
        return "transposed"
    if r < 0.25 and rank >= 1:
        return "sliced"
    if r < 0.35 and rank == 4:
        return "channels_last"
    return "contiguous"


def generate(seed: int, max_ops: int = 7, siblings: float = 0.0) -> tuple[Program, int]:
    """(program, rejected draws) for ``seed``; with probability ``siblings`` the last op is a
    sibling view (``add_sibling``). ``siblings=0`` draws what earlier runs drew."""
    rng = random.Random(seed)
    b = Builder(rng)
    for _ in range(rng.choice((1, 1, 2, 3))):
        b.new_input(draw_shape(rng), rng.choice(DTYPES))
    weights = [f.weight for f in FORMS]
    want = rng.randint(1, max_ops)
    for _ in range(8 * want):
        if len(b.ops) >= want:
            break
        b.try_add(rng.choices(FORMS, weights)[0])
    if not b.ops:
        b.try_add(FORMS[0])  # a unary op always fits
    if siblings and rng.random() < siblings:
        add_sibling(rng, b)
    return Program(tuple(b.inputs), tuple(b.ops), pick_outputs(rng, b.ops)), b.rejected


def add_sibling(rng: random.Random, b: Builder) -> None:
    """A second reader of a value an op reads already, at another rank (a size-1 dim inserted,
    times 2), as the last op and so an output: fused beside the first reader (a reduction over
    a size-1 dim of that value, say), its stores take another shape."""
    read = [a for op in b.ops for a in op.args if b.t(a).dim() < 5]
    if not read:
        return
    x = rng.choice(read)
    d = rng.randint(0, b.t(x).dim())
    b.try_add(Form("sibling", 0.0, lambda _rng, _b: (f"({{0}}.unsqueeze({d}) * 2)", [x])))


def pick_outputs(rng: random.Random, ops: Sequence[OpNode]) -> tuple[str, ...]:
    """The last value, up to two other values no op reads, and at times a value some op reads
    (an output sharing its producer with another output, at another rank)."""
    made = [op.out for op in ops]
    read = {a for op in ops for a in op.args}
    sinks = [v for v in made[:-1] if v not in read]
    extra = rng.sample(sinks, k=min(len(sinks), 2))
    inner = [v for v in made[:-1] if v in read]
    if inner and rng.random() < 0.3:
        extra.append(rng.choice(inner))
    return tuple(dict.fromkeys([made[-1], *extra]))


CALL = re.compile(r"(?:torch\.|F\.|\.)([a-z_][a-z_0-9]*)\(")


def op_labels(template: str) -> list[str]:
    """The ops one template calls (``torch.var`` -> var, ``.view(`` -> view, ``[`` -> getitem,
    operators by symbol)."""
    names = [n for n in CALL.findall(template) if n not in ("ones", "abs", "transpose")]
    names += [s for s in ("//", "%", "@", "&", "|", "^", "~") if s in template]
    if "[" in template and "torch.cat" not in template and "torch.stack" not in template:
        names.append("getitem")
    if not names:
        names = [s for s in ("+", "-", "*", "/", ">", "<", "==") if s in template][:1]
    return names


def check_valid(p: Program) -> None:
    """Runs ``p`` in eager (raises where eager rejects it)."""
    fn, make_inputs = compile_program(p)
    fn(*make_inputs())
