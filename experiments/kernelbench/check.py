"""The CPU mode of the KernelBench runner: one problem at reduced shapes (``problems.py``)
checked through ``autofuse.optimize`` and ``torch.compile(backend="autofuse")`` against eager,
with the kernels each front end generated and the ops that ran as eager steps (dropout
probabilities set to 0: random masks cannot match eager's); for level 3 (or ``train=True``) also a training step (forward and backward through the backend, every
parameter's gradient against eager's; one that fails is judged against a float64 eager step
instead, passing where it is no more than REFERENCE_FACTOR times further from it than eager's
fp32 gradient is: BatchNorm over a batch of 2 at 1x1 spatial size makes the gradients before
it ill-conditioned, and eager fp32 is itself that far off).

Correct means KernelBench's rule: ``torch.allclose(out, ref, atol=tol, rtol=tol)`` for every
output (shapes equal), tol 1e-2 for float32 as the benchmark's original evaluation uses (its
newer evaluation uses 1e-4 for float32 and 1e-2 for 16-bit types: ``strict`` records that one).
"""

from __future__ import annotations

import collections
import functools
import time
import warnings
from typing import Any

from autofuse.settings import settings
from experiments.kernelbench.problems import STAGES, Problem, Stage, instantiate, load_module

# ops that stay library calls (cuDNN / cuBLAS / SDPA / RNN kernels): an eager step of one of
# these does not make a problem less than fully fused
LIBRARY_OPS = frozenset({
    "convolution", "convolution_backward", "mm", "bmm", "addmm", "baddbmm", "matmul", "linear",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "lstm", "gru", "rnn_tanh",
    "rnn_relu", "_cudnn_rnn", "_cudnn_rnn_backward", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward",
})  # fmt: skip
TOL = {"float32": 1e-2, "bfloat16": 1e-2, "float16": 1e-2}
STRICT_TOL = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
# a training step's gradient that fails against eager's passes where it is no more than this
# many times further from a float64 eager step's than eager's fp32 gradient is (eager itself,
# its input moved by one ulp, lands up to ~4x its own distance away on ill-conditioned steps)
REFERENCE_FACTOR = 10.0
NEARBY_STEPS = 2  # draws of nearby inputs on which eager's own gradient error is measured
ZERO_GRAD_FLOOR = 2.0**-16  # a float64-zero gradient's floor, of the step's largest gradient


def op_name(target: Any) -> str:
    """``aten.max_pool2d_with_indices.default`` -> ``max_pool2d_with_indices`` (``prims.x.default``
    likewise)."""
    parts = str(target).split(".")
    return parts[-2] if len(parts) >= 3 else parts[-1]


def eager_steps(plan: Any) -> collections.Counter:
    """A plan's eager steps by ATen op; a ``getitem`` counts as the op whose output it takes."""
    g = plan.graph
    out: collections.Counter = collections.Counter()
    for s in plan.fallbacks:
        node = g[s.node]
        if node.op == "getitem":
            srcs = g.compute_inputs(s.node)
            node = g[srcs[0]] if srcs else node
            name = f"getitem({op_name(node.attr('target', node.op))})"
        else:
            name = op_name(node.attr("target", node.op))
        out[name] += 1
    return out


def is_library(name: str) -> bool:
    base = name[len("getitem(") : -1] if name.startswith("getitem(") else name
    return base in LIBRARY_OPS


def first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def flat(out: Any) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return []


def compare(out: Any, ref: Any, tol: float, scaled: bool = False) -> dict:
    """KernelBench's rule over every output: same shapes, ``allclose(atol=rtol=tol)``; with
    ``scaled`` (a training step's gradients: sums over the batch, whose rounding grows with
    their size) the absolute tolerance is ``tol`` times the tensor's largest magnitude (at
    least 1)."""
    import torch

    outs, refs = flat(out), flat(ref)
    if len(outs) != len(refs):
        return {"correct": False, "why": f"{len(outs)} outputs, eager has {len(refs)}"}
    worst, ok = 0.0, True
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            return {"correct": False, "why": f"shape {tuple(o.shape)} != {tuple(r.shape)}"}
        if r.is_floating_point():
            o64, r64 = o.detach().double(), r.detach().double()
            top = (
                r64.abs().nan_to_num(0.0, 0.0, 0.0).max().item() if scaled and r64.numel() else 1.0
            )
            atol = tol * max(1.0, top)
            ok &= bool(torch.allclose(o64, r64, atol=atol, rtol=tol, equal_nan=True))
            d = (o64 - r64).abs().nan_to_num(0.0)
            worst = max(worst, d.max().item() if d.numel() else 0.0)
        else:
            ok &= bool(torch.equal(o, r))
    return {"correct": ok, "max_abs_err": worst}


def choose_stage(problem: Problem, start: str = "small") -> tuple[Stage, Any, Any, Any, dict]:
    """The first stage (from ``start``) at which eager builds and runs the problem."""
    import torch

    names = [s.name for s in STAGES]
    errors = {}
    for stage in STAGES[names.index(start) :]:
        try:
            module, changed = load_module(problem, stage)
            model, inputs = instantiate(module)
            with torch.no_grad():
                model(*inputs)
            return stage, module, model, inputs, {"changed": changed, "skipped": errors}
        except Exception as e:  # noqa: BLE001 - this stage breaks the problem: try the next
            errors[stage.name] = first_line(e)
    raise RuntimeError(f"eager fails at every stage: {errors}")


def front_end(name: str, make, inputs, ref, tol: float, strict: float, ref64=None) -> dict:
    """One front end built and run under no_grad, judged against eager (then, where that
    fails, against ``ref64()``'s float64 outputs: :func:`judged_by_float64`)."""
    import torch

    from autofuse.frontend import compiled_graphs

    rec: dict[str, Any] = {}
    before = {id(g) for g in compiled_graphs()}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as seen, torch.no_grad():
            warnings.simplefilter("always")
            fn, plans = make()
            out = fn(*inputs)
        rec.update(compare(out, ref, tol))
        if not rec["correct"] and ref64 is not None:
            rec.update(judged_by_float64(out, ref, ref64(), tol) or {})
        rec["strict_correct"] = compare(out, ref, strict)["correct"]
        rec["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in seen})[:10]
    except Exception as e:  # noqa: BLE001 - recorded: the problem fails in this front end
        rec.update({"correct": False, "error": first_line(e)})
        plans = []
    rec["seconds"] = time.perf_counter() - t0
    plans = list(plans) + [g.plan for g in compiled_graphs() if id(g) not in before]
    steps: collections.Counter = collections.Counter()
    for p in plans:
        steps += eager_steps(p)
    rec["kernels"] = sum(len(p.kernels) for p in plans)
    rec["graphs"] = len(plans)
    rec["eager_ops"] = dict(sorted(steps.items()))
    rec["unfused_ops"] = {k: v for k, v in rec["eager_ops"].items() if not is_library(k)}
    return rec


def no_dropout(model) -> None:
    """Dropout probabilities set to 0: random masks cannot match eager's (recorded as such)."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.Dropout | torch.nn.Dropout1d | torch.nn.Dropout2d |
                      torch.nn.Dropout3d | torch.nn.AlphaDropout):  # fmt: skip
            m.p = 0.0


def step_grads(model: Any, fn: Any, inputs: list, weights: list, dtype: Any) -> tuple:
    """``fn``'s outputs and every parameter's gradient (None where it has none) for the backward
    of ``sum(out * w)`` in ``dtype``, the random state seeded first (a forward that draws
    ``torch.randn`` draws the same values)."""
    import torch

    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    out = fn(*inputs)
    sum(((o.to(dtype) * w.to(dtype)).sum() for o, w in zip(flat(out), weights))).backward()
    return out, [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def in_float64(model: Any, inputs: list, run: Any) -> Any:
    """``run(m64, x64)``: ``m64`` a float64 copy of the module, ``x64`` ``inputs`` with their
    floating tensors in float64. The module itself is left as it is (its parameters, their
    gradients and its buffers: a BatchNorm's running statistics a training-mode forward would
    move; cast in place and back, the parameters' data changed, and a plan of it ran in eager
    from then on as a changed module). None where it does not run so (a tensor the forward
    makes itself in float32 meets a float64 one in a matmul): eager's values judge alone."""
    import copy

    import torch

    x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
           for x in inputs]  # fmt: skip
    try:
        m64 = copy.deepcopy(model).to(torch.float64)
        return run(m64, x64)
    except Exception:  # noqa: BLE001 - no float64 reference
        return None


def float64_grads(model: Any, inputs: list, weights: list) -> list | None:
    """The same step in float64 eager (:func:`in_float64`): every parameter's gradient."""
    import torch

    return in_float64(model, inputs, lambda m, xs: step_grads(m, m, xs, weights, torch.float64)[1])


def zero_grad_floors(refs64: list) -> list[float]:
    """Per parameter, the error floor of a gradient that is exactly 0 in float64 (a shift a
    following normalization removes: a BatchNorm's bias before a 1x1 convolution and another
    BatchNorm): computed in fp32 in any order it lands at the rounding of the gradients that
    flow through it, where eager's is 0 only by a symmetry (BatchNorm over two values per
    channel, EfficientNetB2's first block at the reduced size: eager 0, autofuse 3.0 beside
    weight gradients of 5e5 that eager itself is 100 % off). ``ZERO_GRAD_FLOOR`` times the
    step's largest float64 gradient there; 0 for every other gradient."""
    tensors = [r for r in refs64 if r is not None and r.numel()]
    scale = max((float(r.abs().max()) for r in tensors), default=0.0)
    return [ZERO_GRAD_FLOOR * scale if r is not None and r.numel() and not r.any() else 0.0
            for r in refs64]  # fmt: skip


def eager_grad_noise(model: Any, inputs: list, weights: list) -> list[float]:
    """Per parameter, eager fp32's largest gradient error from the float64 step over
    ``NEARBY_STEPS`` draws of nearby inputs (each float moved 1-2 ulps, ``fuzz.reference.
    nearby``): what eager's own rounding can be off by here, where on the judged inputs it
    happens to land close (MobileNetV1's late depthwise layers). 0 for a draw that does not
    run in float64."""
    import torch

    from experiments.fuzz.reference import largest_error, nearby

    noise = [0.0 for _ in model.parameters()]
    for draw in range(NEARBY_STEPS):
        xs = nearby([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs], draw)
        own = step_grads(model, model, xs, weights, torch.float32)[1]
        ref = float64_grads(model, xs, weights) or [None] * len(own)
        noise = [max(n, largest_error(g, r)) for n, g, r in zip(noise, own, ref)]
    return noise


def float64_outputs(model: Any, inputs: list) -> list | None:
    """The model's outputs in float64 eager under no_grad, seeded as the fp32 reference is
    (:func:`in_float64`)."""
    import torch

    def outputs(m: Any, xs: list) -> list:
        with torch.no_grad():
            torch.manual_seed(0)
            return flat(m(*xs))

    return in_float64(model, inputs, outputs)


def judged_by_float64(out: Any, ref: Any, ref64: list | None, tol: float) -> dict | None:
    """Outputs that fail KernelBench's rule against eager's fp32 ones, judged as gradients are
    (``grad_verdict``) against the float64 outputs ``ref64``: ``{"correct": True, ...}`` with
    the worst error ratio where every one passes, else None (the fp32 verdict stands). A
    model whose values reach 1e15 through ``exp`` of sums (Mamba2's segment sums) leaves eager
    fp32 itself outside the rule against float64."""
    outs, refs = flat(out), flat(ref)
    if ref64 is None or len(ref64) != len(refs) or len(outs) != len(refs):
        return None
    triples = list(zip(outs, refs, ref64))
    verdicts = [grad_verdict(*t, tol) for t in triples]
    if "wrong" in verdicts:
        return None
    ratios = [grad_error_ratio(*t) for t, v in zip(triples, verdicts) if v == "float64"]
    return {
        "correct": True,
        "judged_by_float64": True,
        "worst_error_ratio": max(ratios, default=0.0),
    }


def grad_error_ratio(got: Any, eager: Any, ref64: Any, noise: float = 0.0) -> float:
    """How many times further ``got`` is from the float64 gradient than eager's fp32 gradient
    is (largest absolute errors over the tensor; inf where eager's is 0 and ``got``'s is not,
    or where ``got``'s NaNs are not the reference's); ``noise``, eager's own error on nearby
    inputs (``eager_grad_noise``), is the yardstick where it is the larger."""
    import torch

    a, e, r = (t.detach().to(torch.float64) for t in (got, eager, ref64))
    if not torch.equal(a.isnan(), r.isnan()):
        return float("inf")
    keep = ~r.isnan()
    a, e, r = a[keep], e[keep], r[keep]
    if not r.numel():
        return 0.0
    err = torch.where(a == r, 0.0, (a - r).abs()).max().item()
    own = torch.where(e == r, 0.0, (e - r).abs()).nan_to_num(float("inf")).max().item()
    own = max(own, noise)
    return err / own if own > 0 else (0.0 if err == 0 else float("inf"))


def grad_verdict(got: Any, eager: Any, ref64: Any, tol: float, noise: float = 0.0) -> str:
    """``ok`` where the gradient passes KernelBench's rule against eager's fp32 one; else, with a
    float64 gradient at hand, ``float64`` where it passes that rule against the float64 one or
    is no more than REFERENCE_FACTOR times further from it than eager's fp32 gradient is (a
    gradient whose fp32 rounding is amplified, BatchNorm over two values per channel, differs
    between any two fp32 summation orders by as much as eager is off; ``noise``: eager's error
    on nearby inputs, where eager happens to land close on these); else ``wrong``."""
    if (got is None) != (eager is None):
        return "wrong"
    if got is None or compare(got, eager, tol)["correct"]:
        return "ok"
    if ref64 is None or got.shape != ref64.shape:
        return "wrong"
    if (
        compare(got, ref64, tol)["correct"]
        or grad_error_ratio(got, eager, ref64, noise) <= REFERENCE_FACTOR
    ):
        return "float64"
    return "wrong"


def train_step(model, inputs, tol: float, backend: Any = "autofuse", ref64=None) -> dict:
    """Forward and backward of ``sum(out * r)`` (``r`` fixed) through the backend against
    eager: the output and every parameter's gradient (``grad_verdict``: against eager's, then
    against a float64 eager step's). All steps run on the same module (a copy would not do: a
    forward that closes over a submodule, ``self.f = lambda x: m.c_fc(x)``, keeps reading the
    original's parameters), each from the same random state."""
    import torch

    torch.manual_seed(1)
    ref_out = model(*inputs)
    weights = [torch.randn_like(t) for t in flat(ref_out)]
    try:
        ref, ref_grads = step_grads(model, model, inputs, weights, torch.float32)
    except Exception as e:  # noqa: BLE001 - eager's own step fails: judged another way
        return when_eager_raises(model, inputs, weights, tol, backend, e)
    rec: dict[str, Any] = {}
    try:
        compiled = torch.compile(model, backend=backend)
        out, grads = step_grads(model, compiled, inputs, weights, torch.float32)
    except Exception as e:  # noqa: BLE001 - recorded
        return {"correct": False, "error": first_line(e)}
    rec.update(compare(out, ref, tol))
    if not rec["correct"] and ref64 is not None:  # the forward's outputs, as the front ends'
        rec.update(judged_by_float64(out, ref, ref64(), tol) or {})
    verdicts = [grad_verdict(g, r, None, tol) for g, r in zip(grads, ref_grads)]
    refs64 = float64_grads(model, inputs, weights) if "wrong" in verdicts else None
    if refs64 is not None:
        rec["float64_reference"] = True
        noise = zero_grad_floors(refs64)
        verdicts = [grad_verdict(*t, tol, n) for t, n in zip(zip(grads, ref_grads, refs64), noise)]
        if "wrong" in verdicts:
            noise = [max(a, b) for a, b in zip(noise, eager_grad_noise(model, inputs, weights))]
            rec["eager_noise_draws"] = NEARBY_STEPS
            verdicts = [grad_verdict(*t, tol, n)
                        for t, n in zip(zip(grads, ref_grads, refs64), noise)]  # fmt: skip
        by64 = [(*t, n) for t, v, n in zip(zip(grads, ref_grads, refs64), verdicts, noise)
                if v == "float64"]  # fmt: skip
        if by64:
            rec["worst_grad_error_ratio"] = max(grad_error_ratio(*t) for t in by64)
    names = [n for n, _ in model.named_parameters()]
    rec["grads_judged_by_float64"] = [n for n, v in zip(names, verdicts) if v == "float64"][:10]
    bad = [n for n, v in zip(names, verdicts) if v == "wrong"]
    rec["wrong_grads"] = bad[:10]
    rec["correct"] = rec["correct"] and not bad
    return rec


def when_eager_raises(model, inputs, weights, tol: float, backend: Any, err: Exception) -> dict:
    """The training step where eager's own raises (an in-place op on a tensor autograd saved:
    ShuffleNet's ``ReLU(inplace=True)`` after a saved output, VanillaRNN's hidden state written
    in place), judged against torch.compile's own path, ``aot_eager`` (Dynamo and AOTAutograd,
    whose functionalization runs the step as its out-of-place program): correct where both
    raise, or where both run and agree by KernelBench's rule on the outputs and every
    gradient."""
    import torch

    def attempt(b: Any) -> tuple[Any, Exception | None]:
        torch._dynamo.reset()
        try:
            return step_grads(model, torch.compile(model, backend=b), inputs, weights,
                              torch.float32), None  # fmt: skip
        except Exception as e:  # noqa: BLE001 - recorded
            return None, e

    rec: dict[str, Any] = {"eager_error": first_line(err), "judged_against": "aot_eager"}
    (want, want_err), (got, got_err) = attempt("aot_eager"), attempt(backend)
    if want_err is not None or got_err is not None:
        rec["correct"] = want_err is not None and got_err is not None
        rec["aot_eager_error"] = want_err and first_line(want_err)
        rec["backend_error"] = got_err and first_line(got_err)
        return rec
    rec.update(compare(got[0], want[0], tol))
    wrong = [n for (n, _), g, w in zip(model.named_parameters(), got[1], want[1])
             if grad_verdict(g, w, None, tol) != "ok"]  # fmt: skip
    rec["wrong_grads"] = wrong[:10]
    rec["correct"] = rec["correct"] and not wrong
    return rec


def check_problem(problem: Problem, train: bool | None = None, start: str = "small") -> dict:
    """The CPU record of one problem (see the module docstring)."""
    import torch

    import autofuse

    t0 = time.perf_counter()
    stage, module, model, inputs, info = choose_stage(problem, start)
    no_dropout(model)
    with torch.no_grad():
        torch.manual_seed(0)
        ref = model(*inputs)
    tol, strict = TOL["float32"], STRICT_TOL["float32"]
    rec: dict[str, Any] = {"stage": stage.name, "shapes_changed": info["changed"],
                           "stages_skipped": info["skipped"],
                           "input_shapes": [list(x.shape) for x in inputs if hasattr(x, "shape")],
                           "interpreter_block": settings().interpreter_block}  # fmt: skip

    def via_optimize():
        opt = autofuse.optimize(model, inputs)
        return opt, [opt.plan] if getattr(opt, "plan", None) is not None else []

    def via_compile():
        torch._dynamo.reset()
        return torch.compile(model, backend="autofuse"), []

    ref64 = functools.cache(lambda: float64_outputs(model, inputs))
    rec["optimize"] = front_end("optimize", via_optimize, inputs, ref, tol, strict, ref64)
    rec["compile"] = front_end("compile", via_compile, inputs, ref, tol, strict, ref64)
    if train if train is not None else problem.level == 3:
        torch._dynamo.reset()
        rec["train"] = train_step(model, inputs, tol, ref64=ref64)
    fronts = [rec["optimize"], rec["compile"], *([rec["train"]] if "train" in rec else [])]
    rec["correct"] = all(f["correct"] for f in fronts)
    rec["status"] = "ok" if rec["correct"] else (
        "error" if any("error" in f for f in fronts) else "wrong")  # fmt: skip
    # per op, the larger count of the two front ends (the same steps seen twice)
    unfused = collections.Counter(rec["optimize"]["unfused_ops"]) | collections.Counter(
        rec["compile"]["unfused_ops"]
    )
    rec["unfused_ops"] = dict(sorted(unfused.items()))
    rec["fully_fused"] = rec["correct"] and not unfused
    rec["kernels"] = rec["optimize"]["kernels"]
    rec["seconds"] = time.perf_counter() - t0
    return rec
