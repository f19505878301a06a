"""The A/B probe of greedy plans across source trees (experiments/probes/plan_ab.py), on CPU."""

import pytest
import torch

from experiments.probes import plan_ab


def test_one_case_times_the_plan_and_checks_it(tmp_path):
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 1.0

    def fn(x, y):
        return torch.relu(x * y + 1).sum(-1)

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    rec = plan_ab.one_case("tiny", fn, lambda: (x, y), str(tmp_path), timer=timer)
    assert rec["workload"] == "tiny" and len(calls) == 2  # eager and the plan
    assert rec["max_abs_err"] < 1e-5 and rec["build_s"] >= 0


def test_max_error_walks_nested_outputs():
    a, b = torch.zeros(3), torch.tensor([0.0, 2.0, 0.0])
    assert plan_ab.max_error((a, [a]), (a, [b])) == 2.0
    assert plan_ab.max_error(torch.empty(0), torch.empty(0)) == 0.0


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="--problems"):
        plan_ab.kb_cases(str(tmp_path), [7], "cpu")
    with pytest.raises(ValueError, match="--sets"):
        plan_ab.suite_cases(["nope"], "cpu")


def test_kb_cases_read_the_shipped_problem(tmp_path):
    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "7_Tiny.py").write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self, n):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(n, n)\n"
        "    def forward(self, x):\n"
        "        return self.lin(x)\n"
        "batch_size = 300\n"
        "def get_inputs():\n"
        "    return [torch.randn(batch_size, 4)]\n"
        "def get_init_inputs():\n"
        "    return [4]\n"
    )
    ((name, model, make),) = plan_ab.kb_cases(str(tmp_path), [7], "cpu")
    (x,) = make()
    assert name == "L2_7" and not model.training
    assert x.shape == (300, 4) and torch.equal(x, make()[0])  # shipped shape, seeded draws
