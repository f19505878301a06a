"""On a machine without CUDA, ``import autofuse`` turns Triton's interpreter on. Where another
library imported Triton first, Triton's own library functions (``tl.sum``, ``tl.max``) were
built for compiled mode and refused to run in interpreted kernels: every reduction failed."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is selected without CUDA")
def test_triton_imported_before_autofuse_still_runs_reductions(tmp_path):
    script = textwrap.dedent(
        """
        import os
        assert "TRITON_INTERPRET" not in os.environ
        import triton.language as tl  # a library imports Triton first
        import torch, autofuse
        x = torch.randn(4, 16)
        f = lambda x: (torch.softmax(x, -1), x.cumsum(-1), x.amax(0))
        for o, r in zip(autofuse.optimize(f, (x,))(x), f(x)):
            torch.testing.assert_close(o, r)
        print("reductions ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["AUTOFUSE_CACHE_DIR"] = str(tmp_path / "cache")
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "reductions ok" in run.stdout
