"""Sampler choice (a small frozen spec) and its translation to Optuna samplers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, get_args

import optuna

SamplerKind = Literal["tpe", "random", "exhaustive"]
SAMPLER_KINDS: tuple[str, ...] = get_args(SamplerKind)


@dataclass(frozen=True)
class SamplerSpec:
    """Which sampler to use and its options.

    ``seed`` is the base seed; a study that already holds trials offsets it by their number, so
    a resumed run does not replay the first run's random points. The TPE options are always
    passed to Optuna explicitly (its defaults differ between versions); they are ignored by the
    other kinds. ``group=True`` needs ``multivariate=True``.
    """

    kind: SamplerKind = "tpe"
    seed: int | None = 0
    multivariate: bool = True
    group: bool = True
    constant_liar: bool = False
    n_startup_trials: int = 10

    def __post_init__(self) -> None:
        if self.kind not in SAMPLER_KINDS:
            raise ValueError(f"expected sampler kind in {SAMPLER_KINDS}, got {self.kind!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"expected seed to be None or an int >= 0, got {self.seed!r}")
        if not isinstance(self.n_startup_trials, int) or self.n_startup_trials < 0:
            raise ValueError(f"expected n_startup_trials >= 0, got {self.n_startup_trials!r}")
        if self.group and not self.multivariate:
            raise ValueError(
                "expected multivariate=True when group=True (TPE groups need a multivariate "
                "model), got multivariate=False; set group=False too"
            )


SamplerSetting = str | SamplerSpec | optuna.samplers.BaseSampler


def sampler_spec(name: str | SamplerSpec) -> SamplerSpec:
    """Turn ``"tpe"``, ``"random"`` or ``"exhaustive"`` into a :class:`SamplerSpec`."""
    if isinstance(name, SamplerSpec):
        return name
    if isinstance(name, str) and name.strip().lower() in SAMPLER_KINDS:
        return SamplerSpec(kind=name.strip().lower())  # type: ignore[arg-type]
    raise ValueError(
        f"unknown sampler {name!r}: expected one of {list(SAMPLER_KINDS)}, a search.SamplerSpec "
        "or an optuna.samplers.BaseSampler instance"
    )


def resolve_sampler(
    sampler: SamplerSetting, seed_offset: int = 0
) -> tuple[SamplerSpec | None, optuna.samplers.BaseSampler]:
    """The spec (None for a caller's Optuna sampler) and the sampler to use."""
    if not isinstance(sampler, optuna.samplers.BaseSampler):
        spec = sampler_spec(sampler)
        return spec, build_sampler(spec, seed_offset)
    if isinstance(sampler, optuna.samplers.BruteForceSampler) and not isinstance(
        sampler, ExhaustiveSampler
    ):
        raise ValueError(
            "expected sampler='exhaustive' (or SamplerSpec(kind='exhaustive', seed=...)) for a "
            "brute-force search, got an optuna.samplers.BruteForceSampler: it calls "
            "optuna's Study.stop(), which fails outside optuna's own optimize loop"
        )
    return None, sampler


class _StopProbe:
    """Stands in for the study inside ``after_trial``: records ``stop()`` instead of doing it.

    ``Study.stop()`` only works inside ``Study.optimize``; this package drives trials with
    ask/tell, so the exhaustive sampler's stop request is kept as a flag instead.
    """

    def __init__(self, study: optuna.Study, sampler: ExhaustiveSampler) -> None:
        self._probe_study = study
        self._probe_sampler = sampler

    def stop(self) -> None:
        self._probe_sampler.exhausted = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._probe_study, name)


class ExhaustiveSampler(optuna.samplers.BruteForceSampler):
    """Optuna's brute-force sampler (define-by-run, conditional spaces) with an ``exhausted``
    flag raised once every point of the space has been tried."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.exhausted = False

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        super().after_trial(_StopProbe(study, self), trial, state, values)


def build_sampler(spec: SamplerSpec, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    """An Optuna sampler for ``spec``; the seed (when set) is shifted by ``seed_offset``."""
    seed = None if spec.seed is None else spec.seed + seed_offset
    with warnings.catch_warnings():
        # multivariate/group/constant_liar TPE and brute force are "experimental" in Optuna.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec.kind == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if spec.kind == "exhaustive":
            return ExhaustiveSampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=spec.multivariate,
            group=spec.group,
            constant_liar=spec.constant_liar,
            n_startup_trials=spec.n_startup_trials,
        )
