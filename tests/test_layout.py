"""The house stays easy to extend: no module of the package over 650 lines, no import cycle
among its modules, search/ imports no torch, and an op is one entry of the op table."""

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autofuse"
MAX_LINES = 650


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at module level or inside functions (a deferred
    import is a dependency all the same)."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # ``from pkg import submodule`` depends on the submodule; any other name imported
            # from a package depends on its __init__
            targets = subs + ([base] if any(s not in modules for s in subs) else [])
        found |= {t for t in targets if t in modules and t != name}
    return found


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_cycles():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d) :] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert len(graph) > 40  # the walk saw the whole package


def test_no_public_class_is_defined_twice():
    """A record has one definition, imported where needed (two ``PlanChoice`` classes, one per
    chooser, once meant two meanings under one name)."""
    where: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"classes defined in more than one module: {twice}"


def test_search_imports_no_torch():
    for path in (ROOT / "search").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
        }
        names |= {
            (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
        }
        assert "torch" not in names, f"{path} imports torch"


def test_every_op_entry_is_consistent():
    """Each pointwise entry has eager semantics and a rendering; reductions have an identity
    and a combine; every ATen packet maps to one op."""
    from autofuse.ir.ops import OPS

    seen = {}
    for name, d in OPS.items():
        if d.kind == "pointwise" and name not in ("const", "iota"):
            assert d.eager is not None and d.triton is not None, name
        if d.kind == "reduction":
            assert d.identity is not None and d.combine is not None, name
        for a in d.aten:
            assert a not in seen, f"ATen {a} maps to {seen[a]} and {name}"
            seen[a] = name


def test_hypot_is_one_table_entry_and_fuses():
    """hypot: one OpDef (ATen packet, eager, Triton helper, cost); captured, fused with its
    neighbours in one kernel and equal to eager, including inf beside NaN and huge values."""
    from autofuse.capture import capture
    from autofuse.ir.ops import OPS
    from autofuse.partition import Partitioner
    from autofuse.plan import build_plan, execute

    assert OPS["hypot"].aten == ("hypot",)

    def f(x, y):
        return torch.hypot(x * 2.0, y) + 1.0

    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(5, 37, generator=g).to(dtype), torch.randn(5, 37, generator=g).to(dtype)
        x[0, :3] = torch.tensor([float("inf"), 1e30, 0.0])
        y[0, :3] = torch.tensor([float("nan"), 1e30, 0.0])
        graph = capture(f, (x, y)).graph
        assert "hypot" in {n.op for n in graph.nodes}
        part = Partitioner(graph).greedy()
        plan = build_plan(graph, part.groups)
        assert len(plan.kernels) == 1 and not plan.fallbacks
        assert "_af_hypot" in plan.kernels[0].source
        out = execute(plan, [x, y])[0]
        ref = f(x.double(), y.double()).to(dtype)
        assert torch.equal(out.isnan(), ref.isnan())
        assert torch.equal(out.isinf(), ref.isinf())
        fin = ref.isfinite()
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(out[fin].double(), ref[fin].double(), rtol=tol, atol=tol)


def test_copysign_is_one_table_entry_and_fuses():
    """copysign: one OpDef; fused with its neighbours, equal to eager on signed zeros, inf and
    NaN magnitudes, in fp32 and bf16."""
    from autofuse.capture import capture
    from autofuse.ir.ops import OPS
    from autofuse.partition import Partitioner
    from autofuse.plan import build_plan, execute

    assert OPS["copysign"].aten == ("copysign",)

    def f(x, y):
        return torch.copysign(x + 1.0, y * 3.0)

    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(4, 29, generator=g).to(dtype), torch.randn(4, 29, generator=g).to(dtype)
        x[0, :4] = torch.tensor([float("inf"), float("nan"), -2.0, 0.5])
        y[0, :4] = torch.tensor([-0.0, -1.0, 0.0, float("-inf")])
        graph = capture(f, (x, y)).graph
        plan = build_plan(graph, Partitioner(graph).greedy().groups)
        assert len(plan.kernels) == 1 and not plan.fallbacks
        out, ref = execute(plan, [x, y])[0], f(x, y)
        assert torch.equal(out.isnan(), ref.isnan())
        fin = ~ref.isnan()
        assert torch.equal(torch.signbit(out[fin]), torch.signbit(ref[fin]))
        assert torch.allclose(
            out[fin].float(), ref[fin].float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6
        )
