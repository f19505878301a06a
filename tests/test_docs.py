"""The docs a newcomer reads are checked against the code: every ```python block of README.md
and docs/*.md runs (each page's blocks in order, in one fresh process on CPU, with no
TRITON_INTERPRET set: as a user's script), the README stays short, and relative links lead to
files that exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def python_blocks(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text())


def test_docs_are_in_place_and_the_readme_is_short():
    names = {p.name for p in PAGES}
    assert {"guide.md", "backend.md", "tuning.md", "production.md", "internals.md",
            "benchmarks.md"} <= names  # fmt: skip
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    assert (
        "python -m autofuse demo" in readme and ". .venv/bin/activate && python -m pytest" in readme
    )
    first = (ROOT / "results" / "README.md").read_text().split("\n## ")[1]
    assert first.startswith("Current figures") and "| --- |" in first


@pytest.mark.parametrize("page", [*PAGES, ROOT / "results" / "README.md"], ids=lambda p: p.name)
def test_relative_links_lead_to_files(page):
    for target in _LINK.findall(page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


@pytest.mark.slow  # one fresh process, kernels through the interpreter: ~40 s of CPU
def test_python_examples_run_as_scripts_on_cpu(tmp_path):
    """Each page's blocks, in order, as one script run as ``__main__`` (its own globals); the
    pages one after the other in one process (the README's first, with no variable set)."""
    scripts = []
    for page in PAGES:
        if python_blocks(page):
            script = tmp_path / f"{page.stem}_examples.py"
            script.write_text("\n\n".join(python_blocks(page)))
            scripts.append(str(script))
    assert scripts[0].endswith("README_examples.py") and len(scripts) >= 5
    runner = "import runpy, sys\nfor s in sys.argv[1:]:\n    print('running', s, flush=True)\n" \
        "    runpy.run_path(s, run_name='__main__')\n"  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "AUTOFUSE_"))}
    env.update(PYTHONPATH=str(ROOT), AUTOFUSE_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", runner, *scripts], cwd=tmp_path, env=env,
                         text=True, capture_output=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, f"the docs' examples failed:\n{out.stdout}\n{out.stderr}"
    assert out.stdout.count("running ") == len(scripts)
