"""One planner (``autofuse/plan/planner.py``): ``optimize``, ``explain``, the torch.compile
backend, the overnight runner and ``load`` arrive at their plans through it; it is handed the cache and
the search behind two small interfaces, and builds the graph's Partitioner."""

import ast
from pathlib import Path
from types import SimpleNamespace

import torch

from autofuse.capture.trace import capture
from autofuse.plan.planner import Planner

PACKAGE = Path(__file__).resolve().parents[1] / "autofuse"
PLANNER = "autofuse/plan/planner.py"
FRONT_ENDS = (
    "autofuse/api.py",
    "autofuse/frontend/dynamo.py",
    "autofuse/tune/results.py",
    "autofuse/cache/load.py",
)


def _calls(name: str) -> set[str]:
    """The package modules that call ``name(...)``."""
    out = set()
    for path in PACKAGE.rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Call):
                f = n.func
                called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if called == name:
                    out.add(str(path.relative_to(PACKAGE.parent)))
    return out


def test_the_partitioner_is_built_in_the_planner_alone():
    assert _calls("Partitioner") == {PLANNER}


def test_plans_are_built_from_partitions_in_one_place():
    """``planner.assemble``, which the search calls too; a cached plan made at another size of
    its bucket is rebuilt by the planner (``Planner.fitted``), and the CUDA graph choice is the
    planner's (``Planner.replay``) in ``optimize`` as in the backend."""
    assert _calls("build_plan") == {PLANNER}
    assert _calls("assemble") == {PLANNER, "autofuse/tune/tuner.py"}
    assert _calls("choose_replay") == {PLANNER}
    assert _calls("structure_key") <= {
        PLANNER,
        "autofuse/plan/buckets.py",
        "autofuse/cache/buckets.py",
        "autofuse/frontend/dynamo.py",  # keys the structure's partition memo (one per structure)
    }


def test_the_front_ends_plan_through_the_planner():
    """They import the planner, and no untuned or tuned piece of its (the search they hand it
    comes from ``tune/entry.planning``)."""
    for rel in FRONT_ENDS:
        text = (PACKAGE.parent / rel).read_text()
        assert "from autofuse.plan.planner import" in text, rel
        for piece in ("untuned_plan", "tune_and_cache", "build_plan(", "Partitioner("):
            assert piece not in text, (rel, piece)
    assert not (PACKAGE / "tune" / "untuned.py").exists()


def test_the_planner_imports_no_cache_and_no_search():
    tree = ast.parse((PACKAGE / "plan" / "planner.py").read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in names if m and m.startswith(("autofuse.cache", "autofuse.tune"))}


class FakeStore:
    def __init__(self, hit=None):
        self.hit, self.log = hit, []

    def lookup(self, captured, example_inputs, options):
        self.log.append("lookup")
        return self.hit

    def check_writable(self):
        self.log.append("writable")

    def save(self, captured, example_inputs, result, options):
        self.log.append(("save", options.get("trials")))
        return "key"

    def record_call(self, fn, captured, example_inputs):
        self.log.append("call")
        return "call-key"


def _captured():
    def f(x):
        return torch.sigmoid(x) * 2.0

    args = (torch.randn(4, 8),)
    return f, capture(f, args), args


def test_a_cache_hit_is_used_and_nothing_is_searched():
    fn, captured, args = _captured()
    planner = Planner(captured.graph)
    cached = planner.greedy("cached")
    store = FakeStore(hit=(cached, "record"))

    def search(*a, **k):
        raise AssertionError("searched on a cache hit")

    planned = planner.tuned(captured, args, store, search, fn=fn, trials=3)
    assert planned.plan is cached and planned.tuning == "record"
    assert store.log == ["lookup", "call"] and planned.call == "call-key"


def test_a_miss_is_searched_saved_and_its_call_recorded():
    fn, captured, args = _captured()
    planner = Planner(captured.graph)
    store, seen = FakeStore(), []

    def search(c, inputs, space, *, retune, **options):
        seen.append((space is planner.space, retune, options["trials"]))
        return SimpleNamespace(plan=planner.greedy("searched"))

    planned = planner.tuned(captured, args, store, search, fn=fn, trials=3)
    assert seen == [(True, False, 3)] and planned.plan.label == "searched"
    assert store.log == ["lookup", "writable", ("save", 3), "call"] and planned.entry == "key"
    store = FakeStore(hit=("never", None))
    planned = planner.tuned(captured, args, store, search, retune=True, trials=2)
    assert "lookup" not in store.log and planned.call is None  # retune: the cache not read


def test_the_untuned_plan_and_the_explained_plans():
    _, captured, args = _captured()
    planner = Planner(captured.graph)
    planned = planner.untuned("greedy", False, lambda: args)
    assert planned.choice is None and planned.tuning is None and planned.plan.label == "greedy"
    unfused, fused, partition = planner.explained()
    assert (unfused.label, fused.label) == ("unfused", "fused (greedy)")
    assert fused.groups == tuple(frozenset(g) for g in partition.groups)


def test_the_planner_decides_cuda_graph_replay():
    """Off CUDA nothing is timed and nothing replays; the inputs are not even made."""
    import torch

    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(4, 8)
    planner = Planner(capture(f, (x,)).graph)
    plan = planner.greedy()
    made = []
    choice = Planner.replay(plan, False, lambda: made.append(1) or [x])
    assert not choice.replay and choice.plain_s is None and "not on CUDA" in choice.why
    assert not made


def test_a_cached_plan_of_another_size_is_rebuilt_by_the_planner():
    """A bucket's entry (a plan made at another size of the graph's structure) is fitted to the
    graph: its partition rebuilt at this size, the record's plan the rebuilt one; a plan of
    another structure is passed over for the next one offered."""

    def f(x):
        return torch.sigmoid(x) * 2.0

    def g(x):
        return torch.relu(x) + 1.0

    small, big = capture(f, (torch.randn(4, 8),)), capture(f, (torch.randn(4, 16),))
    other = Planner(capture(g, (torch.randn(4, 8),)).graph).greedy("other")
    cached = Planner(small.graph).greedy("bucket")
    planner = Planner(big.graph)
    record = SimpleNamespace(plan=cached)
    hit = planner.first_fit([(other, "skipped"), (cached, record)])
    assert hit is not None and hit.plan.graph is big.graph and hit.plan.label == "bucket"
    assert hit.plan.groups == cached.groups and hit.tuning is record
    assert planner.first_fit([(other, None)]) is None
    same = Planner(small.graph).cached(FakeStore((cached, "r")), small, (), {})
    assert same.plan is cached and same.tuning == "r"
