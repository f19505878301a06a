"""SDPA written out: the torch.compile backend's graph with its SDPA forwards replaced by the
math they compute (``q @ k^T``, scale, mask, softmax, ``@ v``), so autofuse's own attention
kernel (``kernels/attention``) is a candidate beside SDPA's backends.

The backend keeps SDPA whole (one ``aten._scaled_dot_product_*`` op, run by one of SDPA's
backends: ``kernels/library/sdpa.py``). Which is faster depends on the mask, the head dim, the
dtype and the GPU: cuDNN's causal forward beats autofuse's kernel on an H100, while a mask
written as index arithmetic (a sliding window) lets autofuse's kernel skip whole key tiles. So
the planner times both graphs end to end (``Planner.untuned``'s alternatives) and keeps the
faster; ``AUTOFUSE_SDPA=autofuse`` forces the written-out graph wherever it applies.

A forward is written out where the semantics are the same by construction:

- inference only: nothing reads the op's outputs past the attention output (a training forward
  saves backend-specific tensors its backward reads);
- dropout 0; no mask, ``is_causal`` with as many queries as keys (SDPA's causal mask is aligned
  top-left; with equal lengths every row keeps its diagonal), or an additive floating mask
  not computed from -inf (a boolean mask, which SDPA hands its backends as 0 / -inf, is not
  written out: a row it hides entirely is 0 in SDPA's math backend and not a number in a
  plain softmax; masks built with the dtype's lowest finite value, as Hugging Face's are,
  are). A floating mask that is a graph input is taken as it comes: where one of its rows is
  -inf throughout, the written-out graph gives NaN there, and the timed choice does not see
  it;
- grouped-query heads as an expand + reshape of K and V (what the attention kernel reads as
  index arithmetic, no copy).

The softmax runs in float32 and its result is cast to V's dtype (SDPA's backends accumulate in
float32 too); the tolerance of a 16-bit comparison covers the rounding in between.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.operator_schemas import normalize_function

from autofuse import logs
from autofuse.kernels import SDPA_FORWARD_OPS as FORWARD_OPS
from autofuse.settings import settings

from .graph import Prepared, prepare

__all__ = ["WRITTEN", "sdpa_sites", "written_out", "written_variant"]

WRITTEN = "SDPA written out for autofuse's attention kernel"


def _bound(node: torch.fx.Node) -> dict[str, Any] | None:
    """The SDPA forward ``node``'s arguments by schema name (None: not one)."""
    if node.op != "call_function" or str(node.target) not in FORWARD_OPS:
        return None
    norm = normalize_function(
        node.target, tuple(node.args), dict(node.kwargs), normalize_to_only_use_kwargs=True
    )
    return None if norm is None else dict(norm.kwargs)


def _mask_arg(a: dict[str, Any]) -> Any:
    """The mask argument of a bound SDPA forward (a graph node, or None)."""
    return a.get("attn_mask", a.get("attn_bias"))


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def why_not(node: torch.fx.Node) -> str | None:
    """Why the SDPA forward ``node`` is not written out (None: it is; see the module docstring)."""
    a = _bound(node)
    if a is None:
        return "not an SDPA forward"
    if float(a.get("dropout_p") or 0.0) != 0.0:
        return "dropout"
    users = [u for u in node.users if not (u.target is operator.getitem and u.args[1] == 0)]
    if any(u.users for u in users) or any(u.target is not operator.getitem for u in users):
        return "a training forward (its saved tensors are read)"
    q, k, m = _val(a["query"]), _val(a["key"]), _mask_arg(a)
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor) or q.dim() != 4:
        return "not four-dimensional (batch, heads, sequence, head dim)"
    if _val(m) is not None and not _val(m).dtype.is_floating_point:
        return "a boolean mask (a row it hides entirely differs)"
    if _infinite_ancestor(m):
        return "a boolean mask as SDPA passes it on (-inf where hidden: a row it hides entirely differs)"
    if a.get("is_causal") and q.shape[-2] != k.shape[-2]:
        return "causal with fewer queries than keys (SDPA aligns the mask top-left)"
    if q.shape[-3] % k.shape[-3]:
        return "query heads not a multiple of key heads"
    return None


def _infinite_ancestor(mask: Any) -> bool:
    """Whether the graph computes ``mask`` from a -inf constant (SDPA's conversion of a
    boolean mask, or a mask built so): a row may be hidden entirely."""
    seen, todo = set(), [mask] if isinstance(mask, torch.fx.Node) else []
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        flat = torch.fx.node.map_aggregate((n.args, n.kwargs), lambda x: x)
        leaves = torch.utils._pytree.tree_leaves(flat)
        if any(isinstance(x, float) and x == float("-inf") for x in leaves):
            return True
        todo += [x for x in leaves if isinstance(x, torch.fx.Node)]
    return False


def sdpa_sites(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The SDPA forwards of ``gm`` that can be written out."""
    return [n for n in gm.graph.nodes if why_not(n) is None]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None,
    is_causal: bool,
) -> torch.Tensor:
    """SDPA's forward as eager ops (the form autofuse's attention kernel takes)."""
    b, hq, t, d = q.shape
    hk, tk = k.shape[-3], k.shape[-2]
    if hk != hq:  # grouped-query heads: each K / V head read by hq // hk query heads
        k = k[:, :, None].expand(b, hk, hq // hk, tk, d).reshape(b, hq, tk, d)
        dv = v.shape[-1]
        v = v[:, :, None].expand(b, hk, hq // hk, tk, dv).reshape(b, hq, tk, dv)
    s = q @ k.transpose(-1, -2) * (d**-0.5 if scale is None else scale)
    if is_causal:
        i = torch.arange(t, device=q.device)[:, None]
        j = torch.arange(tk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    if mask is not None:
        s = s + mask
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype) @ v


class _WrittenOut(torch.fx.Interpreter):
    """Runs ``gm`` with its writable SDPA forwards replaced by :func:`attention`."""

    def __init__(self, gm: torch.fx.GraphModule, sites: Sequence[torch.fx.Node]) -> None:
        super().__init__(gm)
        self.sites = set(sites)

    def run_node(self, n: torch.fx.Node) -> Any:
        if n not in self.sites:
            return super().run_node(n)
        a = _bound(n)
        q, k, v = (self.env[a[name]] for name in ("query", "key", "value"))
        m = _mask_arg(a)
        mask = self.env[m] if isinstance(m, torch.fx.Node) else None
        out = attention(q, k, v, mask, a.get("scale"), bool(a.get("is_causal")))
        return (out, *(None,) * (len(n.meta.get("val") or ()) - 1))


def _fake_mode(example_inputs: Sequence[Any]) -> FakeTensorMode | None:
    """The fake mode of ``example_inputs``' fake tensors (None: they are real). Not the
    tracing context's: a graph specialized from a symbolic trace has inputs of its own mode."""
    modes = {id(x.fake_mode): x.fake_mode for x in example_inputs if isinstance(x, FakeTensor)}
    if len(modes) > 1:
        raise ValueError("example_inputs: fake tensors of several fake modes")
    return next(iter(modes.values()), None)


def written_out(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], decompositions: dict
) -> torch.fx.GraphModule | None:
    """``gm`` with its SDPA forwards written out, traced again through ``decompositions`` on
    ``example_inputs`` (fake or real); None where none can be (see the module docstring)."""
    sites = sdpa_sites(gm)
    if not sites:
        return None
    with _fake_mode(example_inputs) or contextlib.nullcontext():
        return make_fx(_WrittenOut(gm, sites).run, decomposition_table=decompositions)(
            *example_inputs
        )


def same_convention(a: Prepared, b: Prepared) -> bool:
    """Whether two prepared graphs take the same arguments and give the same results (so a plan
    of either runs with the other's argument handling)."""
    return (
        a.tensor_args == b.tensor_args
        and a.outputs == b.outputs
        and a.specialized == b.specialized
        and a.moved == b.moved
        and a.device == b.device
        and len(a.constants) == len(b.constants)
        and all(x is y for x, y in zip(a.constants, b.constants))
        and [(m.shape, m.stride(), m.dtype) for m in a.out_meta]
        == [(m.shape, m.stride(), m.dtype) for m in b.out_meta]
    )


def written_variant(
    kind: str,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    prepared: Prepared,
    decompositions: dict,
) -> Prepared | None:
    """The inference graph ``gm`` with its SDPA forwards written out, prepared as ``prepared``
    is (None: not an inference graph, ``AUTOFUSE_SDPA`` forces one of SDPA's backends, no
    forward can be written out, or the written graph could not be made with the same calling
    convention: the reason is logged)."""
    if kind != "inference" or settings().sdpa not in ("auto", "autofuse"):
        return None
    try:
        written = written_out(gm, example_inputs, decompositions)
        out = None if written is None else prepare(written, example_inputs)
    except Exception as e:  # noqa: BLE001 - the graph as traced is planned all the same
        logs.log.info("autofuse backend: SDPA not written out: %s: %s", type(e).__name__, e)
        return None
    if out is None:  # no forward can be written out
        return None
    if not same_convention(prepared, out):
        logs.log.info("autofuse backend: SDPA written out changes the graph's arguments")
        return None
    return out
