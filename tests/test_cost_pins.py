"""The cost model's modeled time of every kernel of the pinned corpus (``test_kernel_sources``:
the suite, the model functions and the kind cases; KernelBench aside), pinned exactly: a change
in where the cost model finds a kernel's facts must not change one of its numbers.

Regenerate only when the model changes on purpose::

    python -m tests.test_cost_pins --update
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autofuse.measure.cost_model import CostModel
from tests.test_kernel_sources import default_corpus_kernels

PINS = Path(__file__).resolve().parent / "data" / "modeled_costs.json"


def modeled_costs() -> dict[str, str]:
    model, out = CostModel(), {}
    for name, key, graph, kernel in default_corpus_kernels():
        if not isinstance(kernel, str):
            out[f"{name} {key}"] = repr(model.kernel_time(graph, kernel.info, kernel.config))
    return out


def test_modeled_costs_are_unchanged():
    want, got = json.loads(PINS.read_text()), modeled_costs()
    changed = [f"{k}: {want.get(k)} -> {got.get(k)}" for k in sorted(set(want) | set(got))
               if want.get(k) != got.get(k)]  # fmt: skip
    assert not changed, f"{len(changed)} modeled times changed:\n" + "\n".join(changed[:40])
    kinds = {k.split(" ")[0].split("/")[0] for k in got}
    assert len(got) > 100 and kinds == {"suite", "model", "kinds"}


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit("usage: python -m tests.test_cost_pins --update")
    costs = modeled_costs()
    PINS.write_text(json.dumps(costs, indent=0, sort_keys=True) + "\n")
    print(f"{len(costs)} modeled times -> {PINS}")
