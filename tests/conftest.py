"""Test tiers: CPU tests run generated kernels through Triton's interpreter; tests marked `gpu`
run only where CUDA is available."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # every load and store of every kernel the CPU suite runs is checked against its launch's
    # buffers (on a GPU the mode builds guarded kernels and launches through Triton: opt in)
    os.environ.setdefault("AUTOFUSE_CHECK_BOUNDS", "1")
os.environ.setdefault(
    "AUTOFUSE_KERNEL_DIR", os.path.join(os.getcwd(), ".autofuse_cache", "kernels")
)

from autofuse.settings import reload_settings  # noqa: E402

# pytest imports autofuse for the warning filters in pyproject.toml before this file runs, so
# the settings were read without the variables above: read them again (bounds checking on)
reload_settings()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


@pytest.fixture(autouse=True)
def _interpreter_setting_unchanged(request):
    """A test (or a module imported by one) that turns Triton's interpreter on or off in this
    process would make every later test run its kernels elsewhere: name it."""
    yield
    now = os.environ.get("TRITON_INTERPRET")
    if now != _INTERPRET_AT_START:
        if _INTERPRET_AT_START is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = _INTERPRET_AT_START
        pytest.fail(f"TRITON_INTERPRET changed from {_INTERPRET_AT_START!r} to {now!r} here")


def _settings_with(monkeypatch, **env: str):
    """The settings read again with ``env`` set, for one test; read again after it."""
    from tests.helpers import settings_env

    with settings_env(monkeypatch, **env):
        yield


@pytest.fixture
def split_on(monkeypatch):
    """Split reductions on for CPU inputs too, from 1024 reduced elements (small shapes)."""
    yield from _settings_with(
        monkeypatch, AUTOFUSE_SPLIT_REDUCTIONS="1", AUTOFUSE_SPLIT_MIN_RNUMEL="1024"
    )


@pytest.fixture
def cl_split(monkeypatch):
    """Convolutions channels-last, reductions split from 256 reduced elements (CPU too)."""
    yield from _settings_with(
        monkeypatch,
        AUTOFUSE_CONV_LAYOUT="channels_last",
        AUTOFUSE_SPLIT_REDUCTIONS="1",
        AUTOFUSE_SPLIT_MIN_RNUMEL="256",
    )


@pytest.fixture
def checked_strict(monkeypatch):
    """Every access of every kernel checked against its launch's buffers (the settings may
    have been read before this file set ``AUTOFUSE_CHECK_BOUNDS``), and a kernel that fails to
    build raises instead of running its ops in eager."""
    yield from _settings_with(monkeypatch, AUTOFUSE_CHECK_BOUNDS="1", AUTOFUSE_STRICT="1")


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after a test (compiled graphs, guards, counters)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private cache home and kernel folder, no signing key; fresh loader / launcher caches."""
    from autofuse import settings as af_settings

    monkeypatch.setenv("AUTOFUSE_CACHE_DIR", str(tmp_path / "home"))
    for name in ("AUTOFUSE_KERNEL_DIR", "AUTOFUSE_STRICT", "AUTOFUSE_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    af_settings.reload_settings()
    from tests.helpers import fresh_runtime

    fresh_runtime(monkeypatch)
    yield tmp_path / "home"
    monkeypatch.undo()
    af_settings.reload_settings()
