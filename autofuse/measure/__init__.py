"""The measurement layer: what one candidate kernel costs, and whether it is correct.

The search sees one call, ``measurer.measure(candidate) -> Measurement``:

- ``candidate``: a fusion group under one launch config, cut out of its graph with a structural
  key (the same subgraph elsewhere is measured once); ``Measurement``: a time or a failure.
- ``verify``: the kernel against a float64 eager reference on fresh random inputs.
- ``cost_model``: ``CostModel``, an analytical *model* from the kernel's metadata
  (``source="modeled"``: estimates, never measurements).
- ``timer``: ``GPUTimer`` verifies, then times the launch with an injected benchmark function
  (``do_bench``; L2 flushed, inputs rotated when they would fit in L2).
- ``memo``: ``Memo`` measures each structurally distinct candidate once.
- ``isolate``: ``Isolated`` runs a measurer in a worker process with time-outs.

Fault injection (tests): ``Candidate.source_override`` replaces the generated kernel source. The
override must take the generated kernel's arguments (same loads, stores, sizes and constexprs);
its last ``@triton.jit`` function is the one launched.
"""

from autofuse.measure.candidate import (
    Candidate,
    Measurement,
    Measurer,
    describe_error,
    eager_subgraph,
    extract_group,
    extract_subgraph,
    is_fatal,
)
from autofuse.measure.cost_model import CostModel
from autofuse.measure.isolate import Isolated
from autofuse.measure.memo import Memo
from autofuse.measure.timer import (
    GPUTimer,
    config_timer,
    l2_cache_bytes,
    time_callable,
    time_plan,
)
from autofuse.measure.verify import (
    build_kernel,
    compare,
    group_inputs,
    node_values,
    poisoned_outputs,
    random_inputs,
    reference_outputs,
    verify_candidate,
)

__all__ = [
    "Candidate",
    "CostModel",
    "GPUTimer",
    "Isolated",
    "Measurement",
    "Measurer",
    "Memo",
    "build_kernel",
    "compare",
    "config_timer",
    "describe_error",
    "eager_subgraph",
    "extract_group",
    "extract_subgraph",
    "group_inputs",
    "node_values",
    "is_fatal",
    "l2_cache_bytes",
    "poisoned_outputs",
    "random_inputs",
    "reference_outputs",
    "time_callable",
    "time_plan",
    "verify_candidate",
]
