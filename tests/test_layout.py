"""The house stays easy to extend: no module of the package over 600 lines and no function over
60, no import cycle among its modules, no private name imported from another module, search/
imports no torch, an op is one entry of the op table, and the kernel kinds live in folders
behind one protocol: the pipeline (measure/, tune/, partition/, plan/) names no kind and no
kind's config field."""

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autofuse"
MAX_LINES = 600
MAX_FUNCTION_LINES = 60


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


PIPELINE = ("measure", "tune", "partition", "plan")
LAUNCH_FIELDS = {"num_warps", "num_stages"}  # every launch has them, not one kind's
IR_KINDS = {"pointwise", "reduction"}  # also the IR's op kinds (``Node.kind``)


def _long_functions() -> set[tuple[str, str]]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    out.add((str(path.relative_to(ROOT)), node.name))
    return out


def test_no_function_over_the_line_limit():
    long = _long_functions()
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {sorted(long)}"


def test_no_private_name_is_imported_from_another_module():
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autofuse"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found.add((str(path.relative_to(ROOT)), a.name))
    assert not found, f"private names imported: {sorted(found)}"


def test_the_kinds_live_in_folders_and_the_registry_lists_them():
    from autofuse.kernels import KINDS

    kernels = PACKAGE / "kernels"
    folders = {p.parent.name for p in kernels.glob("*/__init__.py")} - {"common"}
    assert len(folders) >= 3, folders
    assert [p.name for p in kernels.glob("*.py")] == ["__init__.py"]  # no flat kind modules
    for kind in KINDS:
        parts = type(kind).__module__.split(".")
        assert parts[:2] == ["autofuse", "kernels"] and parts[2] in folders, (kind.name, parts)
    # the registry is the one list: no module outside it imports a kind's folder
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).parts
        if rel[0] == "kernels":
            continue
        text = path.read_text()
        for folder in folders:
            assert f"autofuse.kernels.{folder}" not in text, (str(path), folder)


def _named(
    path: Path, forbidden: set[str], strings: set[str] = frozenset()
) -> list[tuple[int, str]]:
    """Where ``path``'s code names one of ``forbidden`` (an attribute, a keyword, a string
    constant, docstrings aside, or a name that is not all lowercase) or holds one of
    ``strings`` as a string constant."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }  # fmt: skip
    hits = []
    for n in ast.walk(tree):
        name = None
        if isinstance(n, ast.Name) and not n.id.islower():
            name = n.id  # a lowercase field (``whole``) is also a plain word: a local's name
        elif isinstance(n, ast.Attribute):
            name = n.attr
        elif isinstance(n, ast.keyword):
            name = n.arg
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            name = n.value
        if name in forbidden or (isinstance(n, ast.Constant) and name in strings):
            hits.append((getattr(n, "lineno", 0), name))
    return hits


def test_the_pipeline_names_no_kind_and_no_kind_config_field():
    """measure/, tune/, partition/ and plan/ ask the kinds (kernels/__init__.py) instead of
    knowing one: no kind's name, no field of a kind's config class in their code."""
    import dataclasses

    from autofuse.ir.ops import OpDef
    from autofuse.kernels import KINDS

    fields = {f.name for k in KINDS for f in dataclasses.fields(k.config_class)}
    kinds = {k.name for k in KINDS} - IR_KINDS
    # an op-table field that is also a kind's name (``OpDef.scatter``) is the IR's as a name;
    # as a string it is a kind's
    op_fields = {f.name for f in dataclasses.fields(OpDef)}
    forbidden = (kinds - op_fields) | (fields - LAUNCH_FIELDS)
    assert {"attention", "gemm", "TMA", "XBLOCK"} <= forbidden and "scatter" in kinds
    hits = {}
    for folder in PIPELINE:
        for path in (PACKAGE / folder).rglob("*.py"):
            if found := _named(path, forbidden, kinds):
                hits[str(path.relative_to(ROOT))] = found
    assert not hits, f"kind names or kind config fields in the pipeline: {hits}"


def test_the_layout_checks_catch_what_they_look_for(tmp_path):
    """The checks above find a kind branch and a kind field (else they could not fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        '''"""doc naming attention"""\nif info.kind == "attention":\n    b = kw["BLOCK_D"]\n'''
    )
    assert [n for _, n in _named(probe, {"attention", "BLOCK_D"})] == ["attention", "BLOCK_D"]
    probe.write_text('x = op.scatter\nif info.kind == "scatter":\n    pass\n')
    assert [n for _, n in _named(probe, set(), {"scatter"})] == ["scatter"]


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


# package loops still there; this list may only shrink (none are left: the routing of calls a
# plan cannot run is its own module, run-folder reading lives in files.py)
KNOWN_PACKAGE_LOOPS: list[set[str]] = []


def _package(module: str) -> str:
    """A module's package: its first component under autofuse/ (``autofuse.ir.graph`` ->
    ``autofuse.ir``; a top-level module such as ``autofuse.logs`` is its own)."""
    return ".".join(module.split(".")[:2])


def _loops(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` with more than one member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_package_import_loops():
    """A package imports another if any of its modules does (at module level or deferred); no
    two packages import each other, directly or around a loop, but the known loop above. The
    root package (``autofuse/__init__.py``, the public facade) is left out."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        for dep in _imports(name, path, modules):
            a, b = _package(name), _package(dep)
            if a != b and "autofuse" not in (a, b):
                graph.setdefault(a, set()).add(b)
    loops = sorted(sorted(c) for c in _loops(graph))
    assert loops == sorted(sorted(c) for c in KNOWN_PACKAGE_LOOPS), (
        f"package loops {loops}: none but KNOWN_PACKAGE_LOOPS, which may only shrink"
    )
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


# autofuse imports inside functions: only those that keep Optuna (the tuner, the study), Dynamo
# (the backend, frontend/optimized and frontend/options) or Triton (a measurement worker before
# its environment is set) out of a process that does not need them. This number may only go
# down.
MAX_DEFERRED_IMPORTS = 8


def _deferred_imports() -> list[tuple[str, int]]:
    """(file, line) of each ``import autofuse...`` / ``from autofuse... import`` in a function."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and not n.level:
                    names = [n.module or ""]
                else:
                    continue
                if any(m.split(".")[0] == "autofuse" for m in names):
                    found.add((str(path.relative_to(ROOT)), n.lineno))
    return sorted(found)


def test_few_imports_are_deferred():
    """A module imports what it needs at the top, where a reader finds its dependencies."""
    deferred = _deferred_imports()
    assert len(deferred) <= MAX_DEFERRED_IMPORTS, (
        f"{len(deferred)} autofuse imports inside functions (at most {MAX_DEFERRED_IMPORTS}): "
        f"{deferred}"
    )


def test_the_partitioner_imports_no_plan_runtime():
    """Legality (which nodes fuse, which cannot lower) comes from the kernel layer: the
    partitioner builds groups without importing the plan runtime."""
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("autofuse.partition"):
            deps = _imports(name, path, modules)
            assert not {d for d in deps if d.startswith("autofuse.plan")}, (name, deps)


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
