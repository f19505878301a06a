"""Tune: an Optuna search (through ``search/``) over fusion decisions x launch configs, every
candidate verified and measured, the best plans re-timed end to end."""

from autofuse.tune.tuner import TuneResult, neighbours, tune

__all__ = ["TuneResult", "neighbours", "tune"]
