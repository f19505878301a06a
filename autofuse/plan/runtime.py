"""Running plans.

A :class:`Plan` (``steps.py``) is a partition of the graph plus one implementation per group:
an ordered list of steps, each a generated kernel, a library call (cuBLAS matmuls) or an op that
runs in eager (unsupported ops); ``build.py`` makes one. Running it allocates the outputs and
the intermediates that must live in memory, runs the steps in order and returns what the
function returns, in the same structure.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from autofuse.bounds import bounds_error
from autofuse.ir.eager import conform, eval_node
from autofuse.ir.graph import Graph, buffer_strides
from autofuse.ir.ops import op_def
from autofuse.kernels import INLINE_OPS, GroupInfo, Kernel
from autofuse.plan.build import build_plan as build_plan
from autofuse.plan.build import eager_group as eager_group
from autofuse.plan.build import eager_reason as eager_reason
from autofuse.plan.launcher import launcher_for
from autofuse.plan.program import program
from autofuse.plan.steps import EagerStep as EagerStep
from autofuse.plan.steps import KernelStep, Plan
from autofuse.plan.steps import LibraryStep as LibraryStep
from autofuse.plan.steps import Step as Step
from autofuse.settings import settings

# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------


class InputError(TypeError):
    """Inputs that do not match what a plan was built for."""


class _Run:
    """One call's state: the plan, the device, the values so far, the program's allocator for
    this call (``program.allocator``). A plain class with slots: made on every call."""

    __slots__ = ("plan", "device", "env", "alloc")

    def __init__(self, plan: Plan, device: torch.device, env: dict | None = None) -> None:
        self.plan, self.device = plan, device
        self.env: dict[int, torch.Tensor] = {} if env is None else env
        self.alloc: Any = None

    def get(self, i: int) -> torch.Tensor:
        if i in self.env:
            return self.env[i]
        node = self.plan.graph[i]
        if node.kind == "view" or node.op in INLINE_OPS:
            value = eval_node(node, [self.get(j) for j in node.inputs], self.device)
        else:
            raise RuntimeError(f"node %{i} ({node.op}) is read before any step computed it")
        self.env[i] = value
        return value

    def laid_out(self, i: int) -> torch.Tensor:
        """Node ``i``'s buffer in the layout kernels read it with (``buffer_strides``)."""
        node = self.plan.graph[i]
        t = self.get(i)
        if node.kind != "input":
            t = self.env[i] = conform(t, node.shape, buffer_strides(node))
        return t

    def launch(self, step: KernelStep) -> None:
        """A kernel step's run on this call (``KernelStep.run``)."""
        run_kernel_step(self, step)


def kernel_args(kernel: Kernel, args: Sequence[torch.Tensor]) -> list[Any]:
    """The kernel's positional arguments: buffers (loaded, then stored) and extents."""
    n_in = len(kernel.info.loads)
    return [
        args[k] if kind == "in" else args[n_in + k] if kind == "out" else k
        for kind, k in kernel.layout
    ]


def launch(kernel: Kernel, args: Sequence[torch.Tensor]) -> None:
    """Launch ``kernel`` on its buffers: the loaded ones, then the stored ones, in order."""
    launcher_for(kernel)(kernel_args(kernel, args))


def new_output(graph: Graph, s: int, device: torch.device) -> torch.Tensor:
    """The buffer a kernel writes node ``s`` into, laid out as kernels read it
    (``buffer_strides``: contiguous but for a layout the plan keeps, ``ir/conv_layout.py``, or a
    convolution the convolution kind stores in the library's layout): zeros for a scatter (its
    kernel writes only the indexed places), else uninitialized."""
    node = graph[s]
    out = torch.empty_strided(
        node.shape, buffer_strides(node), dtype=getattr(torch, node.dtype), device=device
    )
    return out.zero_() if op_def(node.op).scatter else out


def allocate_outputs(graph: Graph, info: GroupInfo, device: torch.device) -> list[torch.Tensor]:
    return [new_output(graph, s, device) for s in info.stored]


_BROKEN: dict[tuple[str, str], str] = {}  # (source, name) -> why it could not be built
_MISALIGNED: set[str] = set()  # kernels already warned about a misaligned input


class KernelBuildWarning(RuntimeWarning):
    """A generated kernel failed to compile or load; its ops ran in eager instead."""


def run_kernel_step(run: _Run, step: KernelStep) -> None:
    kernel = step.kernel
    info = kernel.info
    if (kernel.source, kernel.name) in _BROKEN:
        return run_group_eagerly(run, info)
    try:
        launcher = step.launcher  # imports the kernel's source on its first use
    except Exception as e:  # noqa: BLE001 - a kernel that cannot be loaded must not lose the call
        if settings().strict:
            raise
        return _give_up(run, kernel, e, "loaded")
    env = run.env
    ins = [env[i] if given else run.laid_out(i) for i, given in step.load_kinds(run.plan.graph)]
    align = kernel.meta.input_alignment
    if align and any(t.data_ptr() % align for t in ins):
        if kernel.name not in _MISALIGNED:  # a sliced input, its base off the kernel's alignment
            _MISALIGNED.add(kernel.name)
            warnings.warn(
                f"autofuse: kernel {kernel.name} reads its operands through tensor descriptors, "
                f"which need {align}-byte aligned buffers; an input is not, so its ops run in "
                "eager on such inputs",
                RuntimeWarning,
                stacklevel=3,
            )
        return run_group_eagerly(run, info)
    outs = [new_output(run.plan.graph, s, run.device) for s in info.stored]
    try:
        bufs = [*ins, *outs]
        launcher([bufs[v] if buf else v for buf, v in step.arg_spec])
    except Exception as e:  # noqa: BLE001 - a kernel that cannot be built must not lose the call
        if not _build_error(e) or settings().strict:
            raise
        return _give_up(run, kernel, e, "built")
    for s, t in zip(info.stored, outs):
        run.env[s] = t


def _give_up(run: _Run, kernel: Kernel, e: Exception, what: str) -> None:
    """Mark ``kernel`` broken (one warning) and run its group's ops in eager."""
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    why = f"{type(e).__name__}: {first}"
    _BROKEN[(kernel.source, kernel.name)] = why
    warnings.warn(
        f"autofuse: kernel {kernel.name} could not be {what} ({why}); its "
        f"{len(kernel.info.nodes)} ops run in eager from now on",
        KernelBuildWarning,
        stacklevel=4,
    )
    run_group_eagerly(run, kernel.info)


def _build_error(e: Exception) -> bool:
    """Errors of compiling / loading generated code (not of running it on bad data). Triton's
    interpreter wraps whatever a kernel raises in an InterpreterError: a Python error in its
    body is invalid code (a compiled build rejects it as a CompilationError), except the data
    checks: an access outside its buffers (AUTOFUSE_CHECK_BOUNDS) and a failed
    ``tl.device_assert`` (an index out of range), which must reach the caller."""
    if bounds_error(e) is not None or _device_assert_failed(e):
        return False
    build = {"CompilationError", "OutOfResources", "SyntaxError", "NameError", "ImportError",
             "AttributeError", "PTXASError", "InterpreterError"}  # fmt: skip
    while e is not None:
        if {c.__name__ for c in type(e).__mro__} & build:
            return True
        if isinstance(e, RuntimeError) and (
            "active drivers" in str(e)  # no Triton driver here (no GPU, the interpreter off)
            or "PassManager::run failed" in str(e)  # a compiled build's lowering failed
        ):
            return True
        e = e.__cause__
    return False


def _device_assert_failed(e: BaseException | None) -> bool:
    """``e`` is, or was caused by, an interpreted kernel's failed ``tl.device_assert``."""
    seen = 0
    while e is not None and seen < 16:
        if isinstance(e, AssertionError):
            tb = e.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            if tb is not None and tb.tb_frame.f_code.co_name == "create_assert":
                return True
        e, seen = e.__cause__, seen + 1
    return False


def run_group_eagerly(run: _Run, info: GroupInfo) -> None:
    """Evaluate a group's ops with PyTorch (the fallback of a kernel that cannot be built)."""
    graph = run.plan.graph
    for n in info.nodes:
        node = graph[n]
        run.env[n] = eval_node(node, [run.get(j) for j in node.inputs], run.device)
    # new contiguous buffers, as the kernel would have written them: later kernels read them
    # with no check, and the program may write a later kernel's output into one once it is
    # dead, so none may share memory with what the group read (an op eager returns as it got
    # it: a cast to the same dtype) or with another of its results
    taken = {run.get(j).untyped_storage().data_ptr() for j in info.loads}
    for s in info.stored:
        t = run.env[s]
        ptr = t.untyped_storage().data_ptr()
        shared = t.numel() > 0 and ptr in taken
        run.env[s] = t.clone(memory_format=torch.contiguous_format) if shared else t.contiguous()
        taken.add(run.env[s].untyped_storage().data_ptr())


def input_names(graph: Graph) -> str:
    return ", ".join(graph[i].name or f"input {k}" for k, i in enumerate(graph.inputs))


def check_count(graph: Graph, inputs: Sequence[Any]) -> None:
    if len(inputs) != len(graph.inputs):
        raise InputError(
            f"the plan takes {len(graph.inputs)} tensors ({input_names(graph)}), got {len(inputs)}"
        )


def check_devices(graph: Graph, inputs: Sequence[Any]) -> None:
    """Every input holds data (no meta tensor) and all share one device."""
    first = None
    for k, (idx, x) in enumerate(zip(graph.inputs, inputs)):
        device = getattr(x, "device", None)
        if device is None:
            continue
        label = f"input {k} ({graph[idx].name})"
        if device.type == "meta":
            raise InputError(f"{label} is a meta tensor (no data): pass a tensor with data")
        if first is None:
            first = (label, device)
        elif device != first[1]:
            raise InputError(f"{label} is on {device}, but {first[0]} is on {first[1]}")


def check_inputs(graph: Graph, inputs: Sequence[Any], device_kind: str | None = None) -> None:
    check_count(graph, inputs)
    for k, (idx, x) in enumerate(zip(graph.inputs, inputs)):
        node = graph[idx]
        label = f"input {k} ({node.name})"
        if not isinstance(x, torch.Tensor):
            raise InputError(f"{label}: expected a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != node.shape or str(x.dtype).removeprefix("torch.") != node.dtype:
            raise InputError(
                f"{label}: the plan was built for {node.dtype}{list(node.shape)}, got "
                f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
            )
        live = [(a, b) for a, b, n in zip(x.stride(), node.strides, node.shape) if n > 1]
        if any(a != b for a, b in live):  # the stride of a size-1 dim never addresses memory
            raise InputError(
                f"{label}: the plan was built for strides {node.strides}, got {tuple(x.stride())}"
            )
        if device_kind is not None and x.device.type != device_kind:
            raise InputError(f"{label}: expected a {device_kind} tensor, got one on {x.device}")
    check_devices(graph, inputs)


_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})  # not a subclass with its own dispatch


def _inputs_match(plan: Plan, inputs: Sequence[Any]) -> bool:
    """The common case, cheaply: every input has exactly the captured shape, dtype, strides."""
    specs = plan.input_specs
    if len(inputs) != len(specs):
        return False
    for x, (shape, dtype, strides) in zip(inputs, specs):
        if type(x) not in _PLAIN or x.dtype is not dtype or x.shape != shape:
            return False
        if x.stride() != strides or x.is_neg() or x.is_conj():
            return False
    return True


def resolved(inputs: Sequence[Any]) -> Sequence[Any]:
    """``inputs`` with negative-bit and conjugate views made real (``c.conj().imag`` is a view
    whose values are the negated memory): kernels read memory, so they get the values."""
    if not any(isinstance(x, torch.Tensor) and (x.is_neg() or x.is_conj()) for x in inputs):
        return inputs
    return [_values(x) if isinstance(x, torch.Tensor) else x for x in inputs]


def _values(x: torch.Tensor) -> torch.Tensor:
    """A tensor of ``x``'s values in ``x``'s layout (strides kept: the plan checks them)."""
    if not (x.is_neg() or x.is_conj()):
        return x
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x)


class _Never:
    @staticmethod
    def check(*_: Any) -> bool:
        return False


def _tensor_guards(inputs: Sequence[torch.Tensor]) -> Any:
    """Dynamo's C-level tensor check over these exact inputs (type, dtype, device, grad,
    sizes, strides), or a check that never passes where this torch lacks it."""
    cls = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    try:
        return cls.TensorGuards(
            *inputs,
            dynamic_dims_sizes=[list(x.shape) for x in inputs],
            dynamic_dims_strides=[list(x.stride()) for x in inputs],
        )
    except Exception:  # noqa: BLE001 - another torch's signature: the Python check serves
        return _Never()


class InputGuard:
    """The plan's input check as cheap as torch.compile's: Dynamo's C-level ``TensorGuards``
    (one C call instead of a Python loop over the tensors), built from the inputs the Python
    check (:func:`_inputs_match`) last accepted. Inputs it rejects go to the Python check again
    (a Parameter where a Tensor was seen, another ``requires_grad``, another device); where that
    accepts them, the C-level check is built again from them (a module's calls pass its
    parameters, the plan's verification detached copies: the calls after the first are C)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.fast: Any = None
        # of the inputs the C-level check was built from (so of every input it passes): none
        # requires grad, and their device
        self.grad_free = False
        self.device: torch.device | None = None

    def exact(self, inputs: Sequence[Any]) -> bool:
        """The C-level check alone: every input has the shape, strides, dtype and device of the
        inputs the plan last accepted (False before a first accepted call)."""
        fast = self.fast
        return fast is not None and fast.check(*inputs)

    def __call__(self, inputs: Sequence[Any]) -> bool:
        fast = self.fast
        if fast is not None and fast.check(*inputs):
            return True
        if not _inputs_match(self.plan, inputs):
            return False
        check_devices(self.plan.graph, inputs)  # raises naming a meta or misplaced input
        self.fast = _tensor_guards(inputs)
        self.grad_free = not any(getattr(x, "requires_grad", False) for x in inputs)
        self.device = getattr(inputs[0], "device", None) if inputs else None
        return True


def input_guard(plan: Plan) -> InputGuard:
    """The plan's :class:`InputGuard`, made on first use and kept with the plan."""
    guard = plan.__dict__.get("_input_guard")
    if guard is None:
        guard = plan.__dict__["_input_guard"] = InputGuard(plan)  # frozen: like cached_property
    return guard


def execute(plan: Plan, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run a plan on the flat list of graph inputs; returns the flat list of graph outputs."""
    if not input_guard(plan)(inputs):
        inputs = resolved(inputs)
        check_inputs(plan.graph, inputs)  # raises, naming the input, or accepts (size-1 strides)
    return run_plan(plan, inputs)


def run_plan(
    plan: Plan, inputs: Sequence[torch.Tensor], device: torch.device | None = None
) -> list[torch.Tensor]:
    """``execute`` without the input check (the caller has made it): the plan's program
    (``program.py``: its steps with every lookup made once) on these inputs (on ``device``,
    where the caller knows it)."""
    if device is None:
        device = inputs[0].device if inputs else torch.device("cpu")
    run = _Run(plan, device, dict(zip(plan.graph.inputs, inputs)))
    return program(plan, run_kernel_step, _BROKEN)(run)
