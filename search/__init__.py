"""autofuse's search library: persistent, resumable define-by-run studies on Optuna.

This package never imports torch. Trials are driven with Optuna's ask/tell; every failure of
the objective is recorded with a reason and the search goes on.
"""

from ._damage import DamagedStorageWarning, StorageUnavailable
from ._errors import TrialFailed, TrialPruned, check_time
from ._progress import ProgressBar, progress_bar
from ._records import BUDGET_SPENT_REASON, StudyCounts, TrialRecord, TrialState
from ._samplers import SamplerSpec, sampler_spec
from ._space import Trial
from ._storage import resolve_storage
from ._study import Budget, Study

__all__ = [
    "BUDGET_SPENT_REASON",
    "Budget",
    "DamagedStorageWarning",
    "ProgressBar",
    "SamplerSpec",
    "Study",
    "StorageUnavailable",
    "StudyCounts",
    "Trial",
    "TrialFailed",
    "TrialPruned",
    "TrialRecord",
    "TrialState",
    "check_time",
    "progress_bar",
    "resolve_storage",
    "sampler_spec",
]
