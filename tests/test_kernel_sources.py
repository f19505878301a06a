"""The generated source of every kernel of a fixed corpus, pinned by its sha256.

A refactor of the kernel layer must not change one byte of what it generates. The corpus: the
public suite (``experiments/bench/workloads.py``) at small CPU shapes in bf16, the model
functions (``experiments/bench/model_functions.py``) at their CPU shapes, small functions for the
kinds those do not reach (row GEMM, scan, scatter, the attention backward: a training step
through the backend, its forward and backward graphs, and the convolution kind: 1-3 D, grouped,
depthwise, transposed), and, where the shared KernelBench
folder is present, its level 1 and level 2 problems at the runner's reduced shapes. Each is
captured and partitioned (greedy, untuned, matmuls in cuBLAS); every group's kernel is
generated, never run, at its default config, with runtime sizes where its kind takes them, and
at a few entries of its config space. The hashes live in ``tests/data/kernel_sources.json``.

Regenerate them only when code generation changes on purpose::

    python -m tests.test_kernel_sources --update [--kernelbench]
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autofuse.capture import capture
from autofuse.kernels import (
    FusionRefused,
    Kernel,
    analyze_group,
    bucket_config_fits,
    config_label,
    config_space,
    default_config,
    generate,
)
from autofuse.kernels.common.sizes import runtime_sizes
from autofuse.partition import Partitioner
from autofuse.plan.runtime import eager_group

PINS = Path(__file__).resolve().parent / "data" / "kernel_sources.json"
KB_LEVELS = (1, 2)
SAMPLED = 3  # config-space entries per group beside the default (first, middle, last)

Case = tuple[str, Callable[..., Any], tuple | None]

# the suite's workloads at small CPU shapes (odd sizes: masks and tails)
SUITE_SHAPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "pointwise": ((1000,), (1000,), (1000,)),
    "seed_reduction": ((6, 300),),
    "softmax": ((5, 77),),
    "layernorm": ((6, 96), (96,), (96,)),
    "rmsnorm_residual": ((6, 96), (6, 96), (96,)),
    "sin_cos": ((999,),),
    "gemm_bias_gelu": ((24, 32), (32, 48), (48,)),
    "swiglu": ((24, 32), (32, 40), (32, 40)),
    "mlp_block": ((24, 32), (32,), (32,), (32, 64), (64,), (64, 32), (32,)),
    "attention_scores": ((2, 16, 32), (2, 16, 32), "mask16"),
    "attention_scores_causal": ((2, 16, 32), (2, 16, 32)),
}


def _suite_inputs(name: str) -> tuple:
    g = torch.Generator().manual_seed(0)
    out = []
    for s in SUITE_SHAPES[name]:
        if s == "mask16":
            out.append(torch.rand(16, 16, generator=g) > 0.9)
        else:
            out.append(torch.randn(*s, generator=g).to(torch.bfloat16))
    return tuple(out)


def suite_cases() -> Iterator[Case]:
    from experiments.bench.workloads import SUITE

    assert {w.name for w in SUITE} == set(SUITE_SHAPES), "a suite workload has no CPU shape"
    for w in SUITE:
        yield f"suite/{w.name}", w.fn, _suite_inputs(w.name)


def model_cases() -> Iterator[Case]:
    from experiments.bench.model_functions import MODEL_FUNCTIONS

    for w in MODEL_FUNCTIONS:
        yield f"model/{w.name}", w.fn, tuple(w.inputs("cpu", torch.float32))


def _row_gemm(x, w):
    return torch.softmax(x @ w, dim=-1)


def _scan(x):
    return torch.cumsum(x * 2.0, dim=-1), torch.cumprod(x, dim=0)


def _scatter(x, idx, src):
    return x.index_add(0, idx, src * 2.0), torch.zeros_like(x).scatter_add(1, idx[:, None] % 5, src)


def _attention_step(q, k, v):
    s = torch.softmax((q @ k.transpose(-1, -2)) * 0.25, dim=-1)
    return s @ v


def _backend_graphs(fn: Callable[..., Any], inputs: tuple) -> Callable[[], list]:
    """The forward and backward graphs the backend compiles for a training step of ``fn``."""

    def graphs() -> list:
        from autofuse.frontend import dynamo

        torch._dynamo.reset()
        backend = dynamo.make_backend()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.compile(fn, backend=backend)(*inputs).sum().backward()
        torch._dynamo.reset()
        return [r.plan.graph for r in backend.records]

    return graphs


def _conv_relu(x, w, b):
    return torch.relu(torch.nn.functional.conv2d(x, w, b, stride=2, padding=1, groups=2)) * 0.5


def _depthwise_1d(x, w):
    return torch.sigmoid(torch.nn.functional.conv1d(x, w, padding=2, dilation=2, groups=4))


def _transposed_3d(x, w):
    return torch.nn.functional.conv_transpose3d(x, w, padding=1) + 1.0


def kind_cases() -> Iterator[Case]:
    """Kinds the suite and the model functions do not reach (row GEMM, scan, scatter, the
    attention backward through the backend, the convolution kind)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(12, 16, generator=g), torch.randn(16, 20, generator=g)
    yield "kinds/row_gemm", _row_gemm, (x, w)
    yield "kinds/scan", _scan, (torch.randn(6, 40, generator=g),)
    idx = torch.tensor([0, 2, 2, 5])
    yield "kinds/scatter", _scatter, (torch.randn(6, 5, generator=g), idx, torch.randn(4, 5))
    qkv = [torch.randn(2, 19, 16, generator=g).requires_grad_() for _ in range(3)]
    yield "kinds/attention_train", _backend_graphs(_attention_step, tuple(qkv)), None
    conv = (torch.randn(2, 4, 7, 6, generator=g), torch.randn(6, 2, 3, 3, generator=g))
    yield "kinds/conv", _conv_relu, (*conv, torch.randn(6, generator=g))
    depthwise = (torch.randn(2, 4, 9, generator=g), torch.randn(4, 1, 3, generator=g))
    yield "kinds/conv_depthwise_1d", _depthwise_1d, depthwise
    transposed = (torch.randn(1, 3, 3, 4, 2, generator=g), torch.randn(3, 2, 2, 3, 2, generator=g))
    yield "kinds/conv_transposed_3d", _transposed_3d, transposed


def kernelbench_dir() -> Path | None:
    from experiments.kernelbench.run import default_dir

    return default_dir()


def kernelbench_cases(level: int) -> Iterator[Case]:
    """The level's problems at the first reduced stage eager runs (as the CPU runner does)."""
    from experiments.kernelbench.problems import STAGES, discover, instantiate, load_module

    root = kernelbench_dir()
    assert root is not None
    for problem in discover(root, level):
        for stage in STAGES[:2]:
            try:
                module, _ = load_module(problem, stage)
                model, inputs = instantiate(module)
                with torch.no_grad():
                    model(*inputs)
            except Exception:  # noqa: BLE001 - a stage eager refuses: the next one
                continue
            yield f"kb{level}/{problem.number}", model, tuple(inputs)
            break


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _kernel(graph: Any, info: Any, config: Any, index: int) -> Kernel | str:
    try:
        return generate(graph, info, config, index)
    except Exception as e:  # noqa: BLE001 - a config a kind refuses is pinned as refused
        return f"refused: {type(e).__name__}"


def _sampled(space: list) -> list:
    if len(space) <= SAMPLED:
        return space
    picks = sorted({0, len(space) // 2, len(space) - 1})
    return [space[i] for i in picks]


def _group_kernels(graph: Any, info: Any, index: int) -> Iterator[tuple[str, Kernel | str]]:
    cfg = default_config(info, graph)
    yield f"default {config_label(cfg)}", _kernel(graph, info, cfg, index)
    if bucket_config_fits(info):
        with runtime_sizes(("pin",)):
            cfg = default_config(info, graph)
            yield f"runtime {config_label(cfg)}", _kernel(graph, info, cfg, index)
    for cfg in _sampled(config_space(info, graph)):
        yield f"space {config_label(cfg)}", _kernel(graph, info, cfg, index)


def case_kernels(fn: Callable[..., Any], inputs: tuple | None) -> Iterator[tuple[str, Any, Any]]:
    """Every kernel of ``fn``'s partitions: ``(<partition>/<group nodes>/<config>, graph,
    kernel)``, the kernel a string where it was refused. ``inputs`` None: ``fn()`` gives the
    graphs themselves (keys prefixed by the graph's position)."""
    if inputs is None:
        for n, graph in enumerate(fn()):
            for key, g, kernel in graph_kernels(graph):
                yield f"graph{n}/{key}", g, kernel
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            graph = capture(fn, inputs).graph
        except Exception as e:  # noqa: BLE001 - a capture failure is pinned as such
            yield "capture", None, f"refused: {type(e).__name__}"
            return
    yield from graph_kernels(graph)


def graph_kernels(graph: Any) -> Iterator[tuple[str, Any, Any]]:
    space = Partitioner(graph)
    greedy, untuned = space.greedy(), space.untuned()
    parts = {"greedy": greedy, "untuned": untuned, "library": space.library_gemms(greedy)}
    for pname, part in parts.items():
        for k, group in enumerate(part.groups if part is not None else ()):
            if eager_group(graph, group):
                continue
            nodes = ",".join(map(str, sorted(group)))
            try:
                info = analyze_group(graph, group)
            except FusionRefused:
                continue
            for key, kernel in _group_kernels(graph, info, k):
                yield f"{pname}/{nodes}/{key}", graph, kernel


def case_sources(fn: Callable[..., Any], inputs: tuple) -> dict[str, str]:
    """Every kernel of ``fn``'s partitions: ``<partition>/<group nodes>/<config>`` -> hash."""
    return {
        key: kernel if isinstance(kernel, str) else _digest(kernel.source)
        for key, _, kernel in case_kernels(fn, inputs)
    }


def corpus(kernelbench: bool) -> Iterator[Case]:
    yield from suite_cases()
    yield from model_cases()
    yield from kind_cases()
    if kernelbench:
        for level in KB_LEVELS:
            yield from kernelbench_cases(level)


def _pins() -> dict[str, dict[str, str]]:
    return json.loads(PINS.read_text())


@functools.cache
def default_corpus_kernels() -> tuple[tuple[str, str, Any, Any], ...]:
    """``(case, key, graph, kernel)`` for the default corpus, generated once per process (the
    cost pins price the same kernels)."""
    return tuple(
        (name, key, graph, kernel)
        for name, fn, inputs in corpus(kernelbench=False)
        for key, graph, kernel in case_kernels(fn, inputs)
    )


def _sources_by_case(cases: Iterator[Case] | None) -> Iterator[tuple[str, dict[str, str]]]:
    if cases is not None:
        for name, fn, inputs in cases:
            yield name, case_sources(fn, inputs)
        return
    by_case: dict[str, dict[str, str]] = {}
    for name, key, _, kernel in default_corpus_kernels():
        digest = kernel if isinstance(kernel, str) else _digest(kernel.source)
        by_case.setdefault(name, {})[key] = digest
    yield from by_case.items()


def _check(cases: Iterator[Case] | None) -> int:
    """Compare the hashes of ``cases`` (None: the default corpus) with the pinned ones."""
    pins = _pins()
    changed, count = [], 0
    for name, got in _sources_by_case(cases):
        count += len(got)
        want = pins.get(name)
        if want is None:
            changed.append(f"{name}: not pinned")
            continue
        for key in sorted(set(got) | set(want)):
            if got.get(key) != want.get(key):
                changed.append(f"{name} {key}: {want.get(key)} -> {got.get(key)}")
    assert not changed, f"{len(changed)} generated kernels changed:\n" + "\n".join(changed[:40])
    return count


def test_suite_and_model_function_kernels_are_unchanged():
    count = _check(None)
    assert count > 100  # the corpus generated kernels of every kind


@pytest.mark.exhaustive
@pytest.mark.parametrize("level", KB_LEVELS)
def test_kernelbench_kernels_are_unchanged(level):
    if kernelbench_dir() is None:
        pytest.skip("no KernelBench folder (../shared/kernelbench or $KERNELBENCH_DIR)")
    _check(kernelbench_cases(level))


def update(kernelbench: bool) -> None:
    """Write the hashes of the whole corpus (KernelBench kept as pinned unless asked)."""
    pins = _pins() if PINS.exists() else {}
    if kernelbench and kernelbench_dir() is None:
        raise SystemExit("--kernelbench: no KernelBench folder found")
    for name, fn, inputs in corpus(kernelbench):
        pins[name] = case_sources(fn, inputs)
    PINS.parent.mkdir(parents=True, exist_ok=True)
    PINS.write_text(json.dumps(pins, indent=0, sort_keys=True) + "\n")
    print(f"{len(pins)} cases, {sum(map(len, pins.values()))} kernels -> {PINS}")


if __name__ == "__main__":
    if "--update" not in sys.argv[1:]:
        raise SystemExit("usage: python -m tests.test_kernel_sources --update [--kernelbench]")
    update(kernelbench="--kernelbench" in sys.argv[1:])
