"""Tests of autofuse.kernels.gemm.template through Triton's CPU interpreter (TRITON_INTERPRET=1).

Shapes (M=37, N=45, K=70) leave a masked tail in every dimension; small blocks keep the
interpreter fast.
"""

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ast
import importlib
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import triton  # imported after TRITON_INTERPRET is set

ROOT = Path(__file__).resolve().parents[1]


def _import_template():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("autofuse.kernels.gemm.template")
    except Exception:  # package __init__ missing/broken mid-development: load by path
        path = ROOT / "autofuse" / "kernels" / "gemm" / "template.py"
        spec = importlib.util.spec_from_file_location("_autofuse_gemm_template", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


gt = _import_template()
tiles = importlib.import_module("autofuse.kernels.gemm.tiles")
GemmConfig, GemmSpec = gt.GemmConfig, gt.GemmSpec

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a CUDA GPU", allow_module_level=True)

# fp32 dots: exact in the interpreter, TF32 (Triton's default) on a GPU
FP32_TOL = 1e-4 if INTERPRET else 5e-3
M, N, K = 37, 45, 70
CFG = GemmConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=2, num_stages=2)


@pytest.fixture(scope="module", autouse=True)
def _interpreter_bf16_dot(tmp_path_factory):
    """Work around the interpreter's bf16 tl.dot (triton-lang/triton#11584).

    The interpreter stores bf16 as uint16 and its create_dot multiplies the raw bit
    patterns; autofuse.interpreter converts bf16 operands to fp32 first (what the GPU's bf16
    MMA computes). GPU runs are untouched.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("autofuse_cache")))
        if INTERPRET:
            from autofuse.interpreter import apply_patches

            apply_patches()
        yield


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


def rel_err(out, ref):
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


C_PARAMS = ("c_ptr", "stride_cm", "stride_cn")


def mm_args(a, b, c):
    return dict(
        a_ptr=a,
        b_ptr=b,
        c_ptr=c,
        M=a.shape[0],
        N=b.shape[1],
        K=a.shape[1],
        stride_am=a.stride(0),
        stride_ak=a.stride(1),
        stride_bk=b.stride(0),
        stride_bn=b.stride(1),
        stride_cm=c.stride(0),
        stride_cn=c.stride(1),
    )


def build(spec, cfg=None):
    return gt.load_kernel(gt.render(spec, cfg), spec.name)


MM_SPEC = GemmSpec(
    name="autofuse_mm_test_0",
    batched=False,
    extra_params=C_PARAMS,
    epilogue=lambda: [
        "tl.store(c_ptr + rm * stride_cm + rn * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)"
    ],
)


# --------------------------------------------------------------------------------------
# source


def test_render_valid_python_named_and_ordered():
    spec = GemmSpec(
        name="autofuse_bmm_swiglu_7",
        batched=True,
        n_b=2,
        extra_params=("out_ptr", "stride_ob", "stride_om", "stride_on", "ACT: tl.constexpr"),
        epilogue=lambda: [
            "tl.store(out_ptr + rm * stride_om + rn * stride_on, acc0 * acc1, mask=mask)"
        ],
        doc="silu(x @ w1) * (x @ w2)",
    )
    src = gt.render(spec, CFG)
    assert src.startswith("import triton\nimport triton.language as tl\n")
    tree = ast.parse(src)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in fns] == ["autofuse_bmm_swiglu_7"]
    fn = fns[0]
    assert ast.unparse(fn.decorator_list[0]) == "triton.jit"
    args = [a.arg for a in fn.args.args]
    expected = [
        "a_ptr",
        "b_ptr",
        "b1_ptr",
        "M",
        "N",
        "K",
        "stride_am",
        "stride_ak",
        "stride_bk",
        "stride_bn",
        "stride_b1k",
        "stride_b1n",
        "stride_ab",
        "stride_bb",
        "stride_b1b",
        "out_ptr",
        "stride_ob",
        "stride_om",
        "stride_on",
        "ACT",
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_K",
        "GROUP_M",
    ]
    assert args == expected
    assert gt.param_names(spec) == expected[:-4]
    assert "# silu(x @ w1) * (x @ w2)" in src
    assert "pid_b = tl.program_id(1)" in src
    # importable on its own
    kern = gt.load_kernel(src, spec.name)
    assert kern is gt.load_kernel(src, spec.name)  # cached
    assert kern.fn.__code__.co_filename.startswith(f"<autofuse kernel {spec.name}_")


def test_render_rejects_bad_specs():
    ep = ["tl.store(c_ptr + rm * stride_cm + rn * stride_cn, acc, mask=mask)"]
    with pytest.raises(ValueError, match="assign the variable `a`"):
        gt.render(GemmSpec("k", False, C_PARAMS, load_a=lambda: ["x = 1"], epilogue=lambda: ep))
    with pytest.raises(ValueError, match="collides"):
        gt.render(GemmSpec("k", False, ("acc",), epilogue=lambda: ep))
    with pytest.raises(ValueError, match="epilogue"):
        gt.render(GemmSpec("k", False, C_PARAMS))
    with pytest.raises(ValueError, match="identifier"):
        gt.render(GemmSpec("not-a-name", False, C_PARAMS, epilogue=lambda: ep))
    with pytest.raises(ValueError, match="invalid Python"):
        gt.render(GemmSpec("k", False, C_PARAMS, epilogue=lambda: ["tl.store(("]))


def test_grid():
    assert gt.grid(MM_SPEC, CFG, M, N) == (3 * 2,)
    bspec = GemmSpec("kb", True, C_PARAMS, epilogue=MM_SPEC.epilogue)
    assert gt.grid(bspec, CFG, M, N, batch=5) == (6, 5)


# --------------------------------------------------------------------------------------
# plain GEMMs


@pytest.mark.parametrize(
    "cfg",
    [CFG, GemmConfig(16, 16, 16, GROUP_M=8, num_warps=1), GemmConfig(32, 16, 64, GROUP_M=1)],
    ids=str,
)
def test_mm_fp32(cfg):
    a, b = rand(M, K), rand(K, N, seed=1)
    c = torch.full((M, N), float("nan"), device=DEVICE)
    gt.launch(build(MM_SPEC), MM_SPEC, cfg, **mm_args(a, b, c))
    assert rel_err(c, a @ b) < FP32_TOL


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_mm_bf16(out_dtype):
    a, b = rand(M, K, dtype=torch.bfloat16), rand(K, N, dtype=torch.bfloat16, seed=1)
    c = torch.empty(M, N, dtype=out_dtype, device=DEVICE)
    gt.launch(build(MM_SPEC), MM_SPEC, CFG, **mm_args(a, b, c))
    assert rel_err(c, a.float() @ b.float()) < 1e-2


def test_transposed_operands_by_strides():
    x_t = rand(K, M)  # A = x_t.t(): column-major A
    w = rand(N, K, seed=1)  # B = w.t(): a Linear weight, never copied
    a, b = x_t.t(), w.t()
    assert not a.is_contiguous() and not b.is_contiguous()
    c = torch.empty(M, N, device=DEVICE)
    gt.launch(build(MM_SPEC), MM_SPEC, CFG, **mm_args(a, b, c))
    assert rel_err(c, a @ b) < FP32_TOL


@pytest.mark.parametrize("broadcast", ["a", "b"])
def test_bmm_broadcast_batch_stride_zero(broadcast):
    B = 3
    spec = GemmSpec(
        name="autofuse_bmm_test_0",
        batched=True,
        extra_params=("c_ptr", "stride_cb", "stride_cm", "stride_cn"),
        epilogue=lambda: [
            "c_base = c_ptr + pid_b.to(tl.int64) * stride_cb",
            "tl.store(c_base + rm * stride_cm + rn * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)",
        ],
    )
    if broadcast == "a":
        a, b = rand(M, K).expand(B, M, K), rand(B, N, K, seed=1).transpose(1, 2)
    else:
        a, b = rand(B, M, K), rand(K, N, seed=1).expand(B, K, N)
    c = torch.empty(B, M, N, device=DEVICE)
    args = dict(
        a_ptr=a,
        b_ptr=b,
        c_ptr=c,
        M=M,
        N=N,
        K=K,
        stride_ab=a.stride(0),
        stride_am=a.stride(1),
        stride_ak=a.stride(2),
        stride_bb=b.stride(0),
        stride_bk=b.stride(1),
        stride_bn=b.stride(2),
        stride_cb=c.stride(0),
        stride_cm=c.stride(1),
        stride_cn=c.stride(2),
    )
    assert 0 in (args["stride_ab"], args["stride_bb"])
    gt.launch(build(spec), spec, CFG, batch=B, **args)
    assert rel_err(c, torch.bmm(a, b)) < FP32_TOL


# --------------------------------------------------------------------------------------
# hooks


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_epilogue_bias_gelu_tanh_residual_cast():
    k0 = math.sqrt(2.0 / math.pi)

    def epilogue():
        return [
            "ep_bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)",
            "ep_x = acc + ep_bias[None, :]",
            f"ep_z = {k0!r} * (ep_x + 0.044715 * ep_x * ep_x * ep_x)",
            "ep_tanh = 2.0 * tl.sigmoid(2.0 * ep_z) - 1.0",
            "ep_y = 0.5 * ep_x * (1.0 + ep_tanh)",
            "ep_res = tl.load(res_ptr + rm * stride_rm + rn * stride_rn, mask=mask, other=0.0)",
            "ep_y = ep_y + ep_res.to(tl.float32)",
            "tl.store(c_ptr + rm * stride_cm + rn * stride_cn, ep_y.to(c_ptr.dtype.element_ty), mask=mask)",
        ]

    spec = GemmSpec(
        name="autofuse_mm_fused_addmm_gelu_add_0",
        batched=False,
        extra_params=("bias_ptr", "res_ptr", "stride_rm", "stride_rn") + C_PARAMS,
        epilogue=epilogue,
        doc="gelu_tanh(x @ w.t() + bias) + residual -> bf16",
    )
    x, w, bias = rand(M, K), rand(N, K, seed=1), rand(N, seed=2)
    res = rand(N, M, seed=3).t()  # strided residual
    c = torch.empty(M, N, dtype=torch.bfloat16, device=DEVICE)
    args = mm_args(x, w.t(), c)
    args.update(bias_ptr=bias, res_ptr=res, stride_rm=res.stride(0), stride_rn=res.stride(1))
    gt.launch(build(spec), spec, CFG, **args)
    ref = torch.nn.functional.gelu(x @ w.t() + bias, approximate="tanh") + res
    assert c.dtype == torch.bfloat16
    assert rel_err(c, ref.to(torch.bfloat16)) < 1e-2


def test_prologue_a_row_scale_and_cast_to_bf16():
    def load_a():
        return [
            "a = tl.load(",
            "    a_base + rm * stride_am + offs_k[None, :] * stride_ak,",
            "    mask=mask_m[:, None] & mask_k[None, :],",
            "    other=0.0,",
            ")",
            "pa_scale = tl.load(scale_ptr + offs_m, mask=mask_m, other=0.0)",
            "a = (a.to(tl.float32) * pa_scale[:, None]).to(tl.bfloat16)",
        ]

    spec = GemmSpec(
        name="autofuse_mm_scaled_a_0",
        batched=False,
        extra_params=("scale_ptr",) + C_PARAMS,
        load_a=load_a,
        epilogue=MM_SPEC.epilogue,
    )
    src = gt.render(spec)
    assert "(prologue hook)" in src and "a = (a.to(tl.float32)" in src
    x, s = rand(M, K), rand(M, seed=2)
    w = rand(K, N, dtype=torch.bfloat16, seed=1)
    c = torch.empty(M, N, device=DEVICE)
    args = mm_args(x, w, c)
    args["scale_ptr"] = s
    gt.launch(build(spec), spec, CFG, **args)
    ref = (x * s[:, None]).to(torch.bfloat16).float() @ w.float()
    # bf16 level: the interpreter's fp32->bf16 cast truncates where the GPU rounds to nearest
    assert rel_err(c, ref) < 1e-2
    # a real difference from the unscaled product, so the hook did run
    assert rel_err(c, x @ w.float()) > 0.1


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_horizontal_swiglu_two_b_operands():
    spec = GemmSpec(
        name="autofuse_mm_swiglu_0",
        batched=False,
        n_b=2,
        extra_params=C_PARAMS,
        epilogue=lambda: [
            "ep_y = acc0 * tl.sigmoid(acc0) * acc1",
            "tl.store(c_ptr + rm * stride_cm + rn * stride_cn, ep_y.to(c_ptr.dtype.element_ty), mask=mask)",
        ],
        doc="silu(x @ w1.t()) * (x @ w2.t())",
    )
    src = gt.render(spec)
    assert "acc0 = tl.dot(a, b, acc0)" in src and "acc1 = tl.dot(a, b1, acc1)" in src
    x = rand(M, K, dtype=torch.bfloat16)
    w1 = rand(N, K, dtype=torch.bfloat16, seed=1)  # Linear weights [N, K]: B = w.t()
    w2 = rand(K, N, dtype=torch.bfloat16, seed=2)  # and one already [K, N]
    c = torch.empty(M, N, dtype=torch.float32, device=DEVICE)
    b1 = w1.t()
    args = mm_args(x, b1, c)
    args.update(b1_ptr=w2, stride_b1k=w2.stride(0), stride_b1n=w2.stride(1))
    gt.launch(build(spec), spec, CFG, **args)
    xf = x.float()
    ref = torch.nn.functional.silu(xf @ b1.float()) * (xf @ w2.float())
    assert rel_err(c, ref) < 1e-2


# --------------------------------------------------------------------------------------
# configs


def test_prune_configs_drops_smem_overflow_and_never_empty():
    big = GemmConfig(256, 256, 128, num_warps=8, num_stages=5)  # 5*(2*256*128)*2 B = 640 KiB
    ok = GemmConfig(128, 128, 64, num_warps=4, num_stages=3)  # 96 KiB
    assert big.smem_bytes(2) > tiles.HOPPER_SMEM_BYTES >= ok.smem_bytes(2)
    assert tiles.prune_configs([big, ok], 2, 4096, 4096, 4096) == [ok]
    # n_b counts the second B buffer (and accumulator registers)
    wide = GemmConfig(128, 128, 64, num_warps=8, num_stages=5)  # 5*(8K+8K*2)*2 = 240 KiB
    assert tiles.prune_configs([wide], 2, 4096, 4096, 4096, n_b=1) == [wide]
    assert wide not in tiles.prune_configs([wide, ok], 2, 4096, 4096, 4096, n_b=2)

    # nothing fits: still one config, clamped to the problem and fitting shared memory
    out = tiles.prune_configs([big], 4, 4096, 4096, 4096, smem_bytes=64 * 1024)
    assert len(out) == 1 and out[0].smem_bytes(4) <= 64 * 1024
    out = tiles.prune_configs([big], 2, 5, 7, 9)
    assert len(out) == 1 and (out[0].BLOCK_M, out[0].BLOCK_N, out[0].BLOCK_K) == (16, 16, 16)
    assert tiles.prune_configs([], 2, 5, 7, 9)


@pytest.mark.parametrize(
    "shape", [(1, 4096, 4096), (37, 45, 70), (8192, 8192, 8192), (4096, 16, 4096), (64, 64, 16)]
)
@pytest.mark.parametrize("dtype_bytes", [2, 4])
def test_default_configs_are_sane(shape, dtype_bytes):
    m, n, k = shape
    cands = tiles.default_configs(dtype_bytes, m, n, k)
    assert cands and len(set(cands)) == len(cands)
    for n_b in (1, 2):
        kept = tiles.prune_configs(cands, dtype_bytes, m, n, k, n_b=n_b)
        assert kept and len(set(kept)) == len(kept)
        for c in kept:
            assert c.smem_bytes(dtype_bytes, n_b) <= tiles.HOPPER_SMEM_BYTES
            assert min(c.BLOCK_M, c.BLOCK_N, c.BLOCK_K) >= 16
            # tiles clamped to the problem (a next_pow2 tile covers a dimension)
            assert c.BLOCK_M <= max(16, triton.next_power_of_2(m))
            assert c.BLOCK_N <= max(16, triton.next_power_of_2(n))
            assert c.BLOCK_K <= max(16, triton.next_power_of_2(k))
        assert tiles.prune_configs(kept, dtype_bytes, m, n, k, n_b=n_b) == kept  # idempotent
    if m >= 4096 and n >= 4096:
        assert any(
            c.BLOCK_M * c.BLOCK_N >= 128 * 128 for c in tiles.prune_configs(cands, 2, m, n, k)
        )
