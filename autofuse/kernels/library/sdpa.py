"""The SDPA provider: attention that reaches the IR as one ``aten._scaled_dot_product_*`` op
(the torch.compile backend keeps SDPA whole) run by one of SDPA's own backends.

Torch's SDPA dispatcher picked a backend when the graph was traced (under the flags and the
cuDNN version of that moment), and the graph holds that backend's op: an opaque node whose
target is ``_scaled_dot_product_{cudnn,flash,efficient}_attention`` (CUDA) or
``_scaled_dot_product_flash_attention_for_cpu`` (its outputs read through ``getitem`` nodes);
the math backend is decomposed into matmuls and a softmax when traced and never arrives as one
op. The backward is one ``..._backward`` op of the same backend.

What is offered (:meth:`SdpaProvider.offers`, a group of one such node):

- an **inference** forward (only the attention output is read: none of the op's other outputs,
  the log-sum-exp and RNG state a backward would read, is used or returned): one call per
  backend (``cudnn``, ``flash``, ``efficient``, ``math``) whose semantics cover the node's
  (scale, ``is_causal``, an additive or boolean mask, GQA; dropout 0 only) and which supports
  the node's dtype, shape and device by torch's own checks (``can_use_flash_attention``,
  ``can_use_efficient_attention``, ``can_use_cudnn_attention`` on :class:`SDPAParams`;
  :func:`cuda_supports`), so no backend that would raise is offered. On a CPU only ``flash`` (the
  CPU kernel torch picked) and ``math`` apply. Each call runs
  ``F.scaled_dot_product_attention`` under ``sdpa_kernel(<backend>)``: torch's own argument
  handling (mask conversion, head-dim padding, GQA), one backend allowed;
- a **training** pair: the forward saves backend-specific tensors (flash's log-sum-exp and RNG
  state, efficient's padded log-sum-exp, cuDNN's own) as outputs of the forward graph, and the
  backward graph, compiled apart, reads them in that backend's format. A choice must cover both
  ops, and the two graphs are planned separately, so the pair keeps the backend torch picked:
  the forward is offered nothing (it runs as traced, an eager step whose reason names its
  backend, :func:`eager_note`), and the backward is offered ``math_backward`` alone beside its
  own op: a recomputation from ``q``, ``k``, ``v`` and the output gradient through the math
  backend, which reads none of the forward's saved tensors and so pairs with any forward.

Which one runs (the rule, :meth:`SdpaProvider.preferred`): the backend torch picked when
tracing, that is the op kept as it came; on CUDA the untuned planner and the tuned one time the
offers end to end and keep the traced one unless another is faster (``plan/planner.py``).
``AUTOFUSE_SDPA=<backend>`` offers that backend alone (``math``: ``math_backward`` too) and
runs it wherever it applies, the ops it does not apply to as traced. A graph holding a CUDA
SDPA op keys its cache entry with the cuDNN version, and a forced backend with its name
(:func:`key_parts`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from autofuse.ir.eager import resolve_target
from autofuse.ir.graph import Graph, Node
from autofuse.kernels.library.call import LibraryCall, provided
from autofuse.settings import settings

BACKENDS = ("cudnn", "flash", "efficient", "math")
_SDP = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# the traced op -> (its backend, the device it runs on)
_FORWARD = {
    "aten._scaled_dot_product_cudnn_attention.default": ("cudnn", "cuda"),
    "aten._scaled_dot_product_flash_attention.default": ("flash", "cuda"),
    "aten._scaled_dot_product_efficient_attention.default": ("efficient", "cuda"),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": ("flash", "cpu"),
}
FORWARD_OPS = frozenset(_FORWARD)  # the traced forward ops, by name
_BACKWARD = {t.replace(".default", "_backward.default"): v for t, v in _FORWARD.items()}


@dataclass(frozen=True)
class Attention:
    """What an SDPA node computes, read from its traced op's arguments (``q``, ``k``, ``v``,
    ``mask``, ``grad``: graph nodes; ``grad`` only for a backward)."""

    node: int
    backend: str  # the backend torch picked when tracing
    device: str  # "cuda" | "cpu"
    backward: bool
    q: int
    k: int
    v: int
    mask: int | None
    grad: int | None
    scale: float | None
    is_causal: bool
    dropout: float
    enable_gqa: bool  # k / v have fewer heads than q
    aux_read: bool  # a forward whose outputs beyond the attention output are read
    bias_grad: bool  # a backward asked for the mask's gradient (efficient's grad_input_mask)
    outputs: int  # how many outputs the traced op has

    @property
    def args(self) -> tuple[int, ...]:
        head = (self.grad,) if self.grad is not None else ()
        return (*head, self.q, self.k, self.v, *(() if self.mask is None else (self.mask,)))

    @property
    def params(self) -> tuple[tuple[str, Any], ...]:
        return (
            ("enable_gqa", self.enable_gqa),
            ("is_causal", self.is_causal),
            ("outputs", self.outputs),
            ("scale", self.scale),
        )


def _bound_args(node: Node) -> dict[str, Any]:
    """The traced op's arguments by schema name (a graph input as ``("node", i)``)."""
    schema = resolve_target(node.attr("target"))._schema
    pos = node.attr("args")
    items = pos[2] if isinstance(pos, tuple) and pos and pos[0] == "__seq__" else pos
    names = [a.name for a in schema.arguments]
    out = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    out.update(zip(names, items))
    out.update(dict(node.attr("kwargs") or ()))

    def resolve(v: Any) -> Any:
        if isinstance(v, tuple) and v and v[0] == "__node__":
            return ("node", node.inputs[v[1]])
        if isinstance(v, tuple) and v and v[0] == "__seq__":
            return tuple(resolve(x) for x in v[2])
        return v

    return {k: resolve(v) for k, v in out.items()}


def _node_of(v: Any) -> int | None:
    return v[1] if isinstance(v, tuple) and len(v) == 2 and v[0] == "node" else None


def attention_of(graph: Graph, i: int) -> Attention | None:
    """The SDPA node ``i``'s semantics, or None (not a traced SDPA op this provider knows)."""
    node = graph[i]
    target = node.attr("target") if node.op == "opaque" else None
    backward = target in _BACKWARD
    if target not in _FORWARD and not backward:
        return None
    backend, device = (_BACKWARD if backward else _FORWARD)[target]
    a = _bound_args(node)
    q, k, v = (_node_of(a[n]) for n in ("query", "key", "value"))
    mask = _node_of(a.get("attn_mask", a.get("attn_bias")))
    grad = _node_of(a.get("grad_out", a.get("grad_out_"))) if backward else None
    if None in (q, k, v) or (backward and grad is None):
        return None
    grad_mask = a.get("grad_input_mask") or ()
    heads = (graph[q].shape[-3], graph[k].shape[-3]) if len(graph[q].shape) >= 3 else (1, 1)
    aux = [u for u in graph.users[i] if graph[u].op != "getitem" or graph[u].attr("index") != 0]
    aux_read = any(graph.users[u] or u in graph.outputs for u in aux)
    return Attention(
        node=i, backend=backend, device=device, backward=backward, q=q, k=k, v=v, mask=mask,
        grad=grad, scale=a.get("scale"), is_causal=bool(a.get("is_causal")),
        dropout=float(a.get("dropout_p") or 0.0), enable_gqa=heads[0] != heads[1],
        aux_read=aux_read, bias_grad=len(grad_mask) > 3 and bool(grad_mask[3]),
        outputs=int(node.attr("multi") or 1),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# What each backend supports
# ---------------------------------------------------------------------------------------------

Spec = tuple[tuple[int, ...], tuple[int, ...], str]  # a tensor's shape, strides, dtype


def _spec(graph: Graph, i: int | None) -> Spec | None:
    if i is None:
        return None
    n = graph[i]
    return (tuple(n.shape), tuple(n.strides), n.dtype)


def cuda_supports(
    backend: str,
    q: Spec,
    k: Spec,
    v: Spec,
    mask: Spec | None,
    is_causal: bool,
    enable_gqa: bool,
) -> bool:
    """Whether SDPA's ``backend`` takes tensors of these specs on the current CUDA device, by
    torch's own checks under the SDPA flags set now (False without CUDA, or where building the
    check fails)."""
    if backend == "math":
        return True
    if not torch.cuda.is_available():
        return False
    cuda = torch.backends.cuda
    flags = (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.cudnn_sdp_enabled())
    return _checked(backend, (q, k, v, mask), is_causal, enable_gqa, flags)


@functools.lru_cache(maxsize=256)
def _checked(
    backend: str, specs: tuple, is_causal: bool, enable_gqa: bool, flags: tuple[bool, ...]
) -> bool:
    """:func:`cuda_supports` once per specs and global SDPA flags (those the checks read)."""
    check = {
        "flash": torch.backends.cuda.can_use_flash_attention,
        "efficient": torch.backends.cuda.can_use_efficient_attention,
        "cudnn": torch.backends.cuda.can_use_cudnn_attention,
    }[backend]
    try:
        q_, k_, v_, m_ = (
            None
            if s is None
            else torch.empty_strided(s[0], s[1], dtype=getattr(torch, s[2]), device="cuda")
            for s in specs
        )
        params = torch.backends.cuda.SDPAParams(q_, k_, v_, m_, 0.0, is_causal, enable_gqa)
        return bool(check(params, False))
    except Exception:  # noqa: BLE001 - a check that cannot be made: not offered
        return False


def supports(graph: Graph, a: Attention, backend: str) -> bool:
    """Whether ``backend`` computes the forward ``a`` on its device (see the module docstring)."""
    if backend == "math":
        return True
    if a.device == "cpu":
        return backend == a.backend  # torch's CPU kernel; the CUDA backends do not apply
    specs = (_spec(graph, a.q), _spec(graph, a.k), _spec(graph, a.v), _spec(graph, a.mask))
    return cuda_supports(backend, *specs, a.is_causal, a.enable_gqa)


# ---------------------------------------------------------------------------------------------
# The functions (resolved by name)
# ---------------------------------------------------------------------------------------------


def _forward(backend: str) -> Callable[..., Any]:
    sdp = _SDP[backend]

    def run(q, k, v, *mask, scale, is_causal, enable_gqa, outputs):  # noqa: ANN001, ANN202
        with sdpa_kernel([sdp]):
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask[0] if mask else None, is_causal=is_causal,
                scale=scale, enable_gqa=enable_gqa,
            )  # fmt: skip
        return (out, *(None,) * (outputs - 1))  # the other outputs are read by nothing

    run.__name__ = backend
    return run


def math_backward(grad, q, k, v, *mask, scale, is_causal, enable_gqa, outputs):  # noqa: ANN001, ANN201
    """dq, dk, dv of the math backend, recomputed from ``q``, ``k``, ``v`` (the traced
    backward's other outputs, a mask's gradient, are None: offered only where none is asked)."""
    with torch.enable_grad():
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(
                q_, k_, v_, attn_mask=mask[0] if mask else None, is_causal=is_causal,
                scale=scale, enable_gqa=enable_gqa,
            )  # fmt: skip
        grads = torch.autograd.grad(out, (q_, k_, v_), grad)
    return (*grads, *(None,) * (outputs - 3))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{b: _forward(b) for b in BACKENDS},
    "math_backward": math_backward,
}


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


def forced_backend() -> str | None:
    """``AUTOFUSE_SDPA``'s backend (None: ``auto``, the rule; ``autofuse``, which writes SDPA
    out before this provider sees it, leaves the ops it does not write out to the rule)."""
    value = settings().sdpa
    return None if value in ("auto", "autofuse") else value


class SdpaProvider:
    name = "sdpa"

    def offers(self, graph: Graph, group: frozenset[int]) -> tuple[LibraryCall, ...]:
        if len(group) != 1:
            return ()
        (i,) = group
        a = attention_of(graph, i)
        if a is None or a.dropout != 0.0:
            return ()
        forced = forced_backend()
        if a.backward:
            if a.bias_grad or forced not in (None, "math"):
                return ()
            return (LibraryCall(self.name, "math_backward", a.args, i, (i,), a.params),)
        if a.aux_read:
            return ()
        names = [forced] if forced else [a.backend, *(b for b in BACKENDS if b != a.backend)]
        return tuple(
            LibraryCall(self.name, b, a.args, i, (i,), a.params)
            for b in names
            if supports(graph, a, b)
        )

    def preferred(self, graph: Graph, group: frozenset[int]) -> LibraryCall | None:
        """The call an unmeasured plan runs the group as: the traced backend's, or
        ``AUTOFUSE_SDPA``'s where offered (a backward: ``math_backward`` only when forced);
        None: the op runs as traced."""
        calls = self.offers(graph, group)
        if not calls:
            return None
        a = attention_of(graph, calls[0].out)
        forced = forced_backend()
        if a is None or a.backward:
            return calls[0] if forced == "math" else None
        return calls[0] if calls[0].name == (forced or a.backend) else None

    def function(self, name: str) -> Callable[..., Any]:
        return provided(_FUNCTIONS, "SDPA", name)

    def reason(self, graph: Graph, call: LibraryCall) -> str:
        a = attention_of(graph, call.out)
        traced = a.backend if a is not None else "?"
        if call.name == "math_backward":
            return (
                f"SDPA backward recomputed by the math backend (torch picked {traced} when "
                "tracing; the recomputation reads none of the forward's saved tensors)"
            )
        why = "torch's pick when tracing" if call.name == traced else f"torch picked {traced}"
        if forced_backend() == call.name:
            why = f"AUTOFUSE_SDPA={call.name}; {why}"
        return f"SDPA runs its {call.name} backend ({why})"

    def note(self, graph: Graph, i: int) -> str | None:
        """Why an SDPA node runs as traced (an eager step), naming its backend."""
        return eager_note(graph, i)

    def key_parts(self, graph: Graph) -> dict[str, str]:
        return key_parts(graph)


def eager_note(graph: Graph, i: int) -> str | None:
    """The reason an SDPA node the plan runs as traced gives (None: not an SDPA node)."""
    a = attention_of(graph, i)
    if a is None:
        return None
    what = f"SDPA's {a.backend} backend, as torch picked it when tracing"
    forced = forced_backend()
    if forced is not None and forced != a.backend:
        what += f" (AUTOFUSE_SDPA={forced} does not apply to it)"
    if a.dropout != 0.0:
        return f"{what} (dropout {a.dropout}: no other backend is offered)"
    if a.backward:
        return f"{what}: the backward of a training pair follows its forward"
    if a.aux_read:
        return f"{what}: a training pair (the backward reads this op's saved tensors) keeps it"
    return what


def key_parts(graph: Graph) -> dict[str, str]:
    """What a cache key adds for ``graph``: where it holds a CUDA SDPA op, the cuDNN version
    (a cuDNN SDPA step may be in its plan, and cuDNN's support and speed change by version);
    where it holds any SDPA op and ``AUTOFUSE_SDPA`` forces a backend, that backend."""
    found = [attention_of(graph, i) for i, n in enumerate(graph.nodes) if n.op == "opaque"]
    found = [a for a in found if a is not None]
    parts = {"sdpa": forced_backend()} if found and forced_backend() else {}
    if any(a.device == "cuda" for a in found):
        parts["cudnn"] = str(torch.backends.cudnn.version())
    return parts
