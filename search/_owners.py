"""Which process runs a trial: owner records on RUNNING trials, and the cleanup of trials
left RUNNING by processes that died."""

from __future__ import annotations

import os
import socket
from typing import Any

import optuna

from ._records import DURATION_KEY, INTERRUPTED_REASON, OWNER_KEY, REASON_KEY

_OptunaState = optuna.trial.TrialState


def this_owner() -> dict[str, Any]:
    """The owner record of trials this process runs."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def owner_alive(owner: object) -> bool:
    """Whether the process that started a RUNNING trial may still be running it.

    A trial with no owner record, or owned by a dead process on this host, is dead. Owners on
    other hosts cannot be checked and are assumed alive."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("host") != socket.gethostname():
        return True
    return _pid_alive(owner["pid"])


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True  # no safe liveness probe; leave the trial alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def fail_dead_trials(study: optuna.Study) -> None:
    """Record trials left RUNNING by dead processes as FAIL "interrupted (process died)"."""
    for frozen in study.get_trials(deepcopy=False, states=(_OptunaState.RUNNING,)):
        if owner_alive(frozen.user_attrs.get(OWNER_KEY)):
            continue
        try:
            study._storage.set_trial_user_attr(frozen._trial_id, REASON_KEY, INTERRUPTED_REASON)
            study._storage.set_trial_user_attr(frozen._trial_id, DURATION_KEY, None)
            study.tell(frozen.number, state=_OptunaState.FAIL, skip_if_finished=True)
        except RuntimeError:
            continue  # finished by its owner meanwhile
