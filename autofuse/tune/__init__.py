"""Tune: an Optuna search (through ``search/``) over fusion decisions x launch configs, every
candidate verified and measured, the best plans re-timed end to end.

The tuner (and Optuna) is imported on first use of ``tune`` / ``TuneResult`` / ``neighbours``,
so that a production process (``autofuse.load``, ``autofuse cache ...``) never imports it."""

from typing import Any

__all__ = ["TuneResult", "neighbours", "tune"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from autofuse.tune import tuner

        return getattr(tuner, name)
    raise AttributeError(f"module 'autofuse.tune' has no attribute {name!r}")
