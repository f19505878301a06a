"""``AUTOFUSE_INTERPRETER_BLOCK``: under Triton's interpreter a pointwise kernel's default block
may hold more than the GPU's 1024 elements (fewer programs, each one numpy evaluation per op);
the kernel's source and its values are the same, a bad value is refused naming the variable."""

from __future__ import annotations

import pytest
import torch

import autofuse
from autofuse.settings import reload_settings, settings

from .helpers import assert_close, settings_env


def _chain(x, y):
    return torch.sigmoid(x * 2.0 + y).relu() - y


def _plan(monkeypatch, block: str):
    with settings_env(monkeypatch, AUTOFUSE_INTERPRETER_BLOCK=block):
        x, y = torch.randn(3, 5000), torch.randn(3, 5000)  # 15000 elements, not a block's multiple
        opt = autofuse.optimize(_chain, (x, y))
        assert_close(opt(x, y), _chain(x, y), torch.float32, f"block {block}")
        (kernel,) = [k for k in opt.plan.kernels if k.config is not None]
        return kernel


def test_the_interpreter_block_sets_the_default_config_not_the_source(monkeypatch):
    small, large = _plan(monkeypatch, "1024"), _plan(monkeypatch, "16384")
    assert small.config.XBLOCK == 1024 and large.config.XBLOCK == 16384
    # the block is a launch constant: the kernel is the same past its header comment
    assert small.source.split("@triton.jit")[1] == large.source.split("@triton.jit")[1]


@pytest.mark.parametrize("bad", ["1000", "512", "131072", "big"])
def test_a_bad_interpreter_block_is_refused_by_name(monkeypatch, bad):
    monkeypatch.setenv("AUTOFUSE_INTERPRETER_BLOCK", bad)
    try:
        with pytest.raises(ValueError, match="AUTOFUSE_INTERPRETER_BLOCK"):
            reload_settings()
            settings()
    finally:
        monkeypatch.delenv("AUTOFUSE_INTERPRETER_BLOCK")
        reload_settings()
