"""Test tiers: CPU tests run generated kernels through Triton's interpreter; tests marked `gpu`
run only where CUDA is available."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault(
    "AUTOFUSE_KERNEL_DIR", os.path.join(os.getcwd(), ".autofuse_cache", "kernels")
)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)
