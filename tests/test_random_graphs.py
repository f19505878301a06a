"""Property test: random DAGs of pointwise and reduction ops over random shapes, with broadcast
and non-contiguous inputs; every sampled partition (with sampled configs) equals eager."""

import random

import pytest
import torch

from .helpers import check_partitions

UNARY = [torch.exp, torch.sin, torch.tanh, torch.sigmoid, torch.abs, torch.neg, torch.relu,
         lambda t: t * 0.5, lambda t: torch.sqrt(torch.abs(t) + 1.0)]  # fmt: skip
BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum,
          lambda a, b: a / (torch.abs(b) + 1.0), lambda a, b: torch.where(a > b, a, b * 2.0)]  # fmt: skip
REDUCE = ["sum", "mean", "amax", "amin"]


def random_program(seed):
    rng = random.Random(seed)
    m, n = rng.randint(2, 13), rng.randint(2, 40)
    g = torch.Generator().manual_seed(seed)
    layouts = rng.sample(["full", "t", "slice", "row", "col", "vec"], k=3)
    inputs = []
    for lay in layouts:
        if lay == "full":
            inputs.append(torch.randn(m, n, generator=g))
        elif lay == "t":  # non-contiguous: a transposed view
            inputs.append(torch.randn(n, m, generator=g).t())
        elif lay == "slice":  # non-contiguous: every other column
            inputs.append(torch.randn(m, 2 * n, generator=g)[:, ::2])
        elif lay == "row":
            inputs.append(torch.randn(m, 1, generator=g))
        elif lay == "col":
            inputs.append(torch.randn(1, n, generator=g))
        else:
            inputs.append(torch.randn(n, generator=g))
    steps = []
    for _ in range(rng.randint(3, 7)):
        kind = rng.random()
        if kind < 0.35:
            steps.append(("unary", rng.randrange(len(UNARY)), None))
        elif kind < 0.75:
            steps.append(("binary", rng.randrange(len(BINARY)), rng.random()))
        else:
            steps.append(("reduce", rng.choice(REDUCE), (rng.choice([0, 1]), rng.random() < 0.7)))

    def program(*xs):
        vals = list(xs)
        full = [v for v in vals if v.shape == (m, n)] or [vals[0] * torch.ones(m, n)]
        cur = full[0] + vals[-1]
        outs = []
        for kind, which, extra in steps:
            if kind == "unary":
                cur = UNARY[which](cur)
            elif kind == "binary":
                other = vals[int(extra * len(vals))]
                cur = BINARY[which](cur, other)
            else:
                dim, keep = extra
                if cur.dim() != 2:
                    cur = cur.reshape(m, -1) if cur.numel() % m == 0 and cur.dim() == 1 else cur
                if cur.dim() == 2:
                    red = getattr(torch, which)(cur, dim=dim, keepdim=keep)
                    outs.append(red)
                    cur = cur - (red if keep else red.unsqueeze(dim))  # broadcast back
            vals.append(cur)
        return (cur, *outs[:1])

    return program, tuple(inputs)


# the default run draws 8 programs; the exhaustive tier 16 more
SEEDS = [*range(8), *(pytest.param(s, marks=pytest.mark.exhaustive) for s in range(8, 24))]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_dag(seed):
    fn, args = random_program(seed)
    fn.__name__ = f"random_program_{seed}"
    check_partitions(
        fn, args, torch.float32, configs_per_group=2, seed=seed, max_enumerate=64, sample=10
    )
