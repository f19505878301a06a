"""autofuse's search library: persistent, resumable define-by-run studies on Optuna.

This package never imports torch. Trials are driven with Optuna's ask/tell; every failure of
the objective is recorded with a reason and the search goes on.
"""

from ._errors import TrialFailed, TrialPruned
from ._progress import ProgressBar, progress_bar
from ._records import TrialRecord, TrialState
from ._samplers import SamplerSpec, sampler_spec
from ._space import Trial
from ._storage import resolve_storage
from ._study import Budget, Study

__all__ = [
    "Budget",
    "ProgressBar",
    "SamplerSpec",
    "Study",
    "Trial",
    "TrialFailed",
    "TrialPruned",
    "TrialRecord",
    "TrialState",
    "progress_bar",
    "resolve_storage",
    "sampler_spec",
]
