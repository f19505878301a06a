"""The generated source of every kernel of a fixed corpus, pinned by its sha256.

A refactor of the kernel layer must not change one byte of what it generates. The corpus: the
public suite (``experiments/workloads.py``) at small CPU shapes in bf16, the model functions
(``experiments/model_functions.py``) at their CPU shapes, and, where the shared KernelBench
folder is present, its level 1 and level 2 problems at the runner's reduced shapes. Each is
captured and partitioned (greedy, untuned, matmuls in cuBLAS); every group's kernel is
generated, never run, at its default config, with runtime sizes where its kind takes them, and
at a few entries of its config space. The hashes live in ``tests/data/kernel_sources.json``.

Regenerate them only when code generation changes on purpose::

    python -m tests.test_kernel_sources --update [--kernelbench]
"""

from __future__ import annotations

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

Case = tuple[str, Callable[..., Any], tuple]

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
    from experiments.workloads import SUITE

    assert {w.name for w in SUITE} == set(SUITE_SHAPES), "a suite workload has no CPU shape"
    for w in SUITE:
        yield f"suite/{w.name}", w.fn, _suite_inputs(w.name)


def model_cases() -> Iterator[Case]:
    from experiments.model_functions import MODEL_FUNCTIONS

    for w in MODEL_FUNCTIONS:
        yield f"model/{w.name}", w.fn, tuple(w.inputs("cpu", torch.float32))


def kernelbench_dir() -> Path | None:
    from experiments.kernelbench import default_dir

    return default_dir()


def kernelbench_cases(level: int) -> Iterator[Case]:
    """The level's problems at the first reduced stage eager runs (as the CPU runner does)."""
    from experiments.kernelbench_problems import STAGES, discover, instantiate, load_module

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


def _source(graph: Any, info: Any, config: Any, index: int) -> str:
    try:
        return _digest(generate(graph, info, config, index).source)
    except Exception as e:  # noqa: BLE001 - a config a kind refuses is pinned as refused
        return f"refused: {type(e).__name__}"


def _sampled(space: list) -> list:
    if len(space) <= SAMPLED:
        return space
    picks = sorted({0, len(space) // 2, len(space) - 1})
    return [space[i] for i in picks]


def _group_sources(graph: Any, info: Any, index: int) -> dict[str, str]:
    out = {}
    cfg = default_config(info, graph)
    out[f"default {config_label(cfg)}"] = _source(graph, info, cfg, index)
    if bucket_config_fits(info):
        with runtime_sizes(("pin",)):
            cfg = default_config(info, graph)
            out[f"runtime {config_label(cfg)}"] = _source(graph, info, cfg, index)
    for cfg in _sampled(config_space(info, graph)):
        out[f"space {config_label(cfg)}"] = _source(graph, info, cfg, index)
    return out


def case_sources(fn: Callable[..., Any], inputs: tuple) -> dict[str, str]:
    """Every kernel of ``fn``'s partitions: ``<partition>/<group nodes>/<config>`` -> hash."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            graph = capture(fn, inputs).graph
        except Exception as e:  # noqa: BLE001 - a capture failure is pinned as such
            return {"capture": f"refused: {type(e).__name__}"}
    space = Partitioner(graph)
    greedy, untuned = space.greedy(), space.untuned()
    parts = {"greedy": greedy, "untuned": untuned, "library": space.library_gemms(greedy)}
    out: dict[str, str] = {}
    for pname, part in parts.items():
        for k, group in enumerate(part.groups if part is not None else ()):
            if eager_group(graph, group):
                continue
            nodes = ",".join(map(str, sorted(group)))
            try:
                info = analyze_group(graph, group)
            except FusionRefused:
                continue
            for key, digest in _group_sources(graph, info, k).items():
                out[f"{pname}/{nodes}/{key}"] = digest
    return out


def corpus(kernelbench: bool) -> Iterator[Case]:
    yield from suite_cases()
    yield from model_cases()
    if kernelbench:
        for level in KB_LEVELS:
            yield from kernelbench_cases(level)


def _pins() -> dict[str, dict[str, str]]:
    return json.loads(PINS.read_text())


def _check(cases: Iterator[Case]) -> int:
    pins = _pins()
    changed, count = [], 0
    for name, fn, inputs in cases:
        got = case_sources(fn, inputs)
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
    count = _check(corpus(kernelbench=False))
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
