"""autofuse's decomposition table: what make_fx takes down to primitive ATen ops before capture.

Core ATen's decompositions, plus softmax, log_softmax, layer_norm, gelu, silu, ... and norms
(vector_norm, batch_norm, group_norm) taken to sums / maxima the reduction kernels compute; var,
var_mean and std by moments that stay finite where eager's do; hardtanh, log10, flip, and pools and
constant pads as window offsets (``pooling.py``); mish by one exp (``activations.py``); convolutions without their bias, which is added
by a generated kernel, and inference BatchNorm as a per-channel scale and shift
(``convolution.py``).
"""

from __future__ import annotations

import math

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from autofuse.capture.activations import activation_decompositions
from autofuse.capture.convolution import conv_decompositions
from autofuse.capture.pooling import pooling_decompositions
from autofuse.ir.kept_ops import upsample_bicubic2d

aten = torch.ops.aten


def log2_ceil(m) -> int:
    """The least k with 2^k >= m (0 for m <= 1), by comparisons: a symbolic size is then
    guarded by the power-of-two range it lies in (its shape bucket), not by its value."""
    k = 0
    while 2**k < m:
        k += 1
    return k


def _moment_mean(x, dims, n):
    """The mean over ``dims`` (kept) for var / var_mean / std / layer_norm / group_norm /
    batch_norm: exact on a constant row and finite wherever the true mean is, as eager's
    Welford moments are.

    Exact: a value of the row, ``x0`` (its maximum: a row reduction every reduction kind fuses,
    the GEMM + row kind included, where a read of the row's first element is not), plus the
    mean of ``x - x0``, which is 0 on a constant row, so the row minus its mean is 0 and its
    variance 0 (a plain sum of n equal values rounds: layer_norm with eps=1e-12 then scaled
    that rounding by 1e6). The mean does not depend on ``x0`` (its gradient through it is 0), so
    ``x0`` is detached: its backward adds nothing but rounding noise. Finite: sum(x)
    overflows on a row of finfo.min (a masked row); the differences are taken of x * 2^-k and
    x0 * 2^-k, 2^k >= 2n (an exact scaling), so neither they nor their sum can overflow for
    finite inputs (an infinite ``x0`` is replaced by 0: inf - inf would be NaN). The finite
    mean is clamped into the dtype's range (it may round an ulp past it)."""
    if not x.is_floating_point() or n == 0:
        return torch.mean(x, dims, keepdim=True)
    k = log2_ceil(2 * n)  # ceil(log2(n)) + 1
    x0 = (torch.amax(x, dims, keepdim=True) if dims else x).detach()  # no gradient: see above
    x0 = torch.where(x0.abs() == math.inf, 0.0, x0)
    h0 = x0 * 2.0**-k
    s = torch.sum(x * 2.0**-k - h0, dims, keepdim=True)
    m = (h0 + s / n) * 2.0**k
    fi = torch.finfo(x.dtype)
    return torch.where(s.abs() == math.inf, m, m.clamp(fi.min, fi.max))


def _centered(x, mean):
    """``x - mean``, exactly 0 where they are equal: a GPU compiler contracts a product's
    ``a * b - mean`` into one fused multiply-add, whose result is the product's rounding error,
    not the 0 of the rounded product eager subtracts (a constant row's variance then is not 0,
    and a one-element ``var`` is a number, not eager's 0 / 0). Its gradient where they are
    equal is 0, not 1: right for the variance's square and absolute value (0 there either way),
    not for a normalization's ``(x - mean) * rstd``. Only where nothing is left to divide by:
    the extra select in every variance took L2_52's BatchNorm statistics from 1281 to 2757 us
    (fp32, H100), where a constant row's rounding error squared is far inside tolerance."""
    return torch.where(x == mean, 0.0, x - mean)


def _reduced_dims(x, dim) -> list[int]:
    """The dims a var / std reduces: every dim for None; none for a 0-d tensor (whose only
    allowed dims, 0 and -1, name the tensor itself)."""
    if x.dim() == 0:
        return []
    return list(range(x.dim())) if dim is None else [d % x.dim() for d in dim]


def _var_decomp(x, dim=None, *, correction=None, keepdim=False, mean=None, root=False):
    """var (std with ``root``): finite wherever eager's is. 16-bit inputs are computed in
    float32 as eager accumulates them; where the plain sum of squares overflows (|x - mean|
    past the square root of the dtype's max, where eager's Welford moments do not), the sum of
    (diff * 2^-k)^2 is used and scaled back (2^-k exact, keeping n squares in range)."""
    dims = _reduced_dims(x, dim)
    n = math.prod(x.shape[d] for d in dims) if dims else 1
    corr = 1 if correction is None else correction
    low = x.dtype in (torch.float16, torch.bfloat16)
    xf = x.float() if low else x
    mean = _moment_mean(xf, dims, n) if mean is None else mean.to(xf.dtype)
    diff = xf - mean
    div = max(n - corr, 0)
    if div == 0:  # eager: x / 0, inf where the row varies, NaN where constant (or NaN)
        # |x - mean| is 0 only on a constant row (a square can underflow to 0; eager's can not)
        out = torch.sum(_centered(xf, mean).abs(), dims, keepdim=keepdim) / div
        return out.to(x.dtype) if low else out
    var = torch.sum(diff * diff, dims, keepdim=keepdim) / div
    out = torch.sqrt(var) if root else var
    if xf.is_floating_point():
        top = math.frexp(torch.finfo(xf.dtype).max)[1]  # the max is just under 2^top
        k = top // 2 + (log2_ceil(n) + 1) // 2 + 1  # + ceil(log2(n) / 2)
        scaled = diff * 2.0**-k
        small = torch.sum(scaled * scaled, dims, keepdim=keepdim) / div
        big = torch.sqrt(small) * 2.0**k if root else small * 2.0**k * 2.0**k
        rescued = torch.where(small.abs() == math.inf, out, big)  # (ops the kernels render)
        out = torch.where(var.abs() == math.inf, rescued, out)
    return out.to(x.dtype) if low else out


def _var_mean_decomp(x, dim=None, *, correction=None, keepdim=False):
    dims = _reduced_dims(x, dim)
    low = x.dtype in (torch.float16, torch.bfloat16)
    xf = x.float() if low else x
    mean = _moment_mean(xf, dims, math.prod(x.shape[d] for d in dims) if dims else 1)
    var = _var_decomp(xf, dims, correction=correction, keepdim=keepdim, mean=mean)
    mean = mean if keepdim else mean.squeeze(dims)
    return (var.to(x.dtype), mean.to(x.dtype)) if low else (var, mean)


def _std_decomp(x, dim=None, *, correction=None, keepdim=False):
    return _var_decomp(x, dim, correction=correction, keepdim=keepdim, root=True)


def _group_norm_decomp(x, weight, bias, n, c, hw, group, eps):
    """native_group_norm as a row reduction: x viewed as [N, G, C/G, HxW] (each group one
    row over its channels and pixels), normalized in fp32 for 16-bit inputs; mean and rstd per
    (N, G) as eager returns. The channels and the pixels stay two dims, so the view is one of a
    channels-last x too (a merged C/G * HxW dim is not): the split reads such a row as memory
    holds it, a group's channels whole in every chunk (``ir/split.py``). An empty input keeps
    eager's own op (its rows have no length to divide by)."""
    if x.numel() == 0:
        return NotImplemented
    low = x.dtype in (torch.float16, torch.bfloat16)
    xg = x.reshape(n, group, c // group, -1)
    xg = xg.float() if low else xg  # cast over the reduction's domain: one kernel with it
    var, mean = _var_mean_decomp(xg, [2, 3], correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = ((xg - mean) * rstd).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(per_channel)
    if bias is not None:
        y = y + bias.reshape(per_channel)
    return y.to(x.dtype), mean.reshape(n, group).to(x.dtype), rstd.reshape(n, group).to(x.dtype)


def _empty_group_norm_backward(decomp):
    """native_group_norm_backward, where a group holds no element (HxW or C / group 0) without
    the decomposition's 1 / (HxW * C / group): the input's gradient is empty and the sums
    over the groups are 0, so weight's is sum_N((0 - 0 * mean) * rstd) and bias's 0, as eager."""

    def decomposed(dy, x, mean, rstd, gamma, n, c, hw, group, mask):
        if hw * (c // group):
            return decomp(dy, x, mean, rstd, gamma, n, c, hw, group, mask)
        zero = mean.new_zeros(n, group, c // group)
        dw = ((zero - zero * mean.unsqueeze(-1)) * rstd.unsqueeze(-1)).sum(0).reshape(c)
        return (
            torch.zeros_like(x) if mask[0] else None,
            dw.to(x.dtype) if mask[1] else None,
            x.new_zeros(c) if mask[2] else None,
        )

    return decomposed


def _log10(x):
    """log10 as log / ln(10) (a generated op; within an ulp or two of eager's)."""
    return torch.log(x) / math.log(10.0)


def _flip(x, dims):
    """flip as an index_select by a reversed arange per dim (a generated gather)."""
    for d in dims:
        n = x.shape[d]
        x = torch.index_select(x, d, torch.arange(n - 1, -1, -1, device=x.device))
    return x if dims else x.clone()


def _multilabel_margin_loss(x, target, reduction):
    """multilabel_margin_loss's forward (loss, is_target). Each row's targets end at its first
    -1; the hinge ``max(0, 1 - x[y_j] + x[i]) / C`` is summed over its targets j and the other
    classes i. Torch's own decomposition leaves out the mask of the targets past the end (they
    gather class 0): its loss differs from the op's wherever a row ends before its last entry."""
    shape = target.shape
    x2, t2 = torch.atleast_2d(x), torch.atleast_2d(target)
    c = x2.shape[1]
    idx = torch.arange(c, device=t2.device)
    end = torch.amin(torch.where(t2 == -1, idx, c), dim=-1, keepdim=True)
    valid = idx < end  # (N, C): position j holds a target
    gathered = torch.gather(x2, -1, torch.where(valid, t2, 0))  # x[n, y_j]
    is_target = torch.any(idx == torch.where(valid, t2, -1).unsqueeze(-1), dim=1)  # (N, C)
    z = (1.0 - gathered.T.unsqueeze(-1) + x2).clamp_min(0) / c  # (j, N, i)
    z = torch.where(is_target | ~valid.T.unsqueeze(-1), 0, z)
    z = z.sum(dim=(0, -1))
    if reduction == 1:  # mean
        z = z.mean()
    elif reduction == 2:  # sum
        z = z.sum()
    elif x.dim() <= 1:
        z = z.reshape(())
    return z, is_target.to(x.dtype).reshape(shape)


def _multilabel_margin_loss_value(x, target, reduction=1):
    """multilabel_margin_loss: the loss of :func:`_multilabel_margin_loss`."""
    return _multilabel_margin_loss(x, target, reduction)[0]


def _functional_multilabel_margin_loss(x, target, size_average=None, reduce=None, reduction="mean"):
    """``F.multilabel_margin_loss`` as :func:`_multilabel_margin_loss` computes it (torch
    registers its own decomposition at the autograd key, so a table cannot replace it: the
    torch.compile backend swaps the call in Dynamo's graph, ``function_fixes``)."""
    if size_average is not None or reduce is not None:
        r = torch.nn._reduction.legacy_get_enum(size_average, reduce)
    else:
        r = torch.nn._reduction.get_enum(reduction)
    return _multilabel_margin_loss(x, target, r)[0]


def _interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):  # fmt: skip
    """``F.interpolate``, except that a uint8 bicubic resize of a 4-d input calls the op eager
    runs (``upsample_bicubic2d``, kept whole) rather than the call torch decomposes at the
    autograd key (see :func:`_not_for`)."""
    if x.dtype != torch.uint8 or mode != "bicubic" or antialias or x.dim() != 4:
        return torch.nn.functional.interpolate(
            x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias
        )
    if size is not None:
        out = [size] * 2 if isinstance(size, int) else list(size)
        scales = [None, None]
    else:
        sf = [scale_factor] * 2 if isinstance(scale_factor, (int, float)) else list(scale_factor)
        out = [math.floor(n * f) for n, f in zip(x.shape[-2:], sf)]
        scales = [None, None] if recompute_scale_factor else sf
    return upsample_bicubic2d(x, out, bool(align_corners), *scales)


def function_fixes() -> dict:
    """Torch functions whose traced form is wrong, by the function computing them right: the
    torch.compile backend replaces them in Dynamo's graph before AOTAutograd traces it."""
    return {
        torch.nn.functional.multilabel_margin_loss: _functional_multilabel_margin_loss,
        torch._C._nn.multilabel_margin_loss: _multilabel_margin_loss_value,
        torch.nn.functional.interpolate: _interpolate,
    }


def _not_for(dtype, decomp):
    """``decomp`` except on a ``self`` of ``dtype``: eager's op then. index_add's decomposition
    scales the source by alpha into an integer and cannot put it back into a bool tensor;
    bicubic upsampling's rounds 0.4 % of uint8 outputs one step from eager's integer kernel
    (torch's own compiled form differs the same way)."""

    def decomposed(x, *args, **kwargs):
        if x.dtype == dtype:
            return NotImplemented
        return decomp(x, *args, **kwargs)

    return decomposed


def _float_results_only(decomp):
    """linspace / logspace's ``decomp`` where the result is float32 or float64, eager's op
    otherwise. The decomposition steps from the unrounded endpoints in float32 and rounds once;
    eager's integer kernel steps from the truncated start (linspace(4.3, -3, 50) in int32 is 1
    off in 7 of 50 places), its 16-bit kernels round the endpoints first (bf16 logspace(4.3,
    -3, 2) starts at 20480, the decomposition at 19968). Inductor runs the decomposition."""

    def decomposed(*args, **kwargs):
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        if dtype not in (torch.float32, torch.float64):
            return NotImplemented
        return decomp(*args, **kwargs)

    return decomposed


def _op_where_it_fails(decomp):
    """``decomp``, or the op itself (eager's op) where the decomposition raises: some are
    stricter than the op (addcmul's on integer tensors with a float ``value`` raises where
    eager rounds), and an input eager rejects makes the op raise as eager would."""

    def decomposed(*args, **kwargs):
        try:
            return decomp(*args, **kwargs)
        except Exception:  # noqa: BLE001 - any error: the op decides, as in eager
            return NotImplemented

    return decomposed


def decomposition_table() -> dict:
    table = dict(core_aten_decompositions())
    table.update(
        get_decompositions(
            [
                aten._softmax,
                aten._log_softmax,
                aten.native_layer_norm,
                aten.gelu,
                aten.silu,
                aten.hardsigmoid,
                aten.hardswish,
                aten.masked_fill.Scalar,
                aten.masked_fill.Tensor,
                aten.linear,
                aten.addcmul,
                aten.addcdiv,
                aten.leaky_relu,
                aten.hardtanh,
                aten.elu,
                aten.softplus,
                aten.rms_norm,
                aten.linalg_vector_norm,
                aten.native_batch_norm,
                aten._native_batch_norm_legit,
                aten._native_batch_norm_legit_no_training,
                aten._native_batch_norm_legit_functional,
            ]
        )
    )
    for op in (aten.var.correction, aten.var.dim):
        table[op] = _var_decomp
    table[aten.var_mean.correction] = _var_mean_decomp
    table[aten.std.correction] = _std_decomp
    table[aten.native_group_norm.default] = _group_norm_decomp
    gn_back = aten.native_group_norm_backward.default
    table[gn_back] = _empty_group_norm_backward(table[gn_back])
    for op in (aten.index_add.default, aten.index_add_.default):
        table[op] = _not_for(torch.bool, table[op])
    for op in (aten.upsample_bicubic2d.default, aten.upsample_bicubic2d.vec):
        if op in table:
            table[op] = _not_for(torch.uint8, table[op])
    for op in [op for op in table if op.overloadpacket in (aten.linspace, aten.logspace)]:
        table[op] = _float_results_only(table[op])
    table[aten.log10.default] = _log10
    table[aten.flip.default] = _flip
    table[aten.multilabel_margin_loss_forward.default] = _multilabel_margin_loss
    table[aten.multilabel_margin_loss.default] = _multilabel_margin_loss_value
    table.update(pooling_decompositions())  # pools and constant pads (capture/pooling.py)
    table.update(activation_decompositions())  # mish by one exp (capture/activations.py)
    table.update(conv_decompositions())  # bias peeled, inference BatchNorm (convolution.py)
    return {op: _op_where_it_fails(decomp) for op, decomp in table.items()}
