"""The define-by-run trial handle an objective receives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import optuna

from ._records import ATTR_PREFIX

Choice = None | bool | int | float | str
NoteValue = str | int | float
_CHOICE_TYPES = (type(None), bool, int, float, str)


@runtime_checkable
class Trial(Protocol):
    """What an objective may ask of a trial: parameters (define-by-run) and notes."""

    number: int

    def categorical(self, name: str, choices: Sequence[Choice]) -> Any: ...

    def integer(self, name: str, low: int, high: int, step: int = 1) -> int: ...

    def pow2(self, name: str, low: int, high: int) -> int: ...

    def set_note(self, key: str, value: NoteValue) -> None: ...


def is_pow2(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


def pow2_choices(low: int, high: int) -> list[int]:
    """The powers of two in [low, high]; both bounds must be powers of two."""
    for label, bound in (("low", low), ("high", high)):
        if not is_pow2(bound):
            raise ValueError(f"pow2 expected {label} to be a power of two >= 1, got {bound!r}")
    if low > high:
        raise ValueError(f"pow2 expected low <= high, got low={low}, high={high}")
    return [1 << k for k in range(low.bit_length() - 1, high.bit_length())]


MAX_NAME_LENGTH = 512  # Optuna's SQL storages keep parameter names in VARCHAR(512)


def _check_name(name: object) -> None:
    """Any readable non-empty str is a name (``fuse:layernorm→linear``, ``kernel3.XBLOCK``);
    it is stored as is, so Optuna's dashboard shows it."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"expected a non-empty str parameter name, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"expected a parameter name of at most {MAX_NAME_LENGTH} characters, got "
            f"{len(name)}: {name[:40]!r}..."
        )


def _check_int(label: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected {label} to be an int, got {type(value).__name__} {value!r}")


def _check_choices(name: str, choices: object) -> list[Choice]:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise TypeError(f"categorical {name!r} expected a sequence of choices, got {choices!r}")
    if len(choices) == 0:
        raise ValueError(f"categorical {name!r} expected at least one choice, got none")
    bad = [c for c in choices if not isinstance(c, _CHOICE_TYPES)]
    if bad:
        raise TypeError(
            f"categorical {name!r} expected choices of None/bool/int/float/str, got {bad!r}"
        )
    return list(choices)


class OptunaTrial:
    """:class:`Trial` backed by an Optuna trial from ``Study.ask()``."""

    def __init__(self, trial: optuna.trial.Trial) -> None:
        self._trial = trial
        self.number: int = trial.number
        self.notes: dict[str, NoteValue] = {}

    @property
    def params(self) -> dict[str, Any]:
        """The parameters chosen so far in this trial."""
        return dict(self._trial.params)

    def categorical(self, name: str, choices: Sequence[Choice]) -> Any:
        _check_name(name)
        return self._trial.suggest_categorical(name, _check_choices(name, choices))

    def integer(self, name: str, low: int, high: int, step: int = 1) -> int:
        _check_name(name)
        for label, value in (("low", low), ("high", high), ("step", step)):
            _check_int(f"integer {name!r} {label}", value)
        if step < 1:
            raise ValueError(f"integer {name!r} expected step >= 1, got {step}")
        if low > high:
            raise ValueError(f"integer {name!r} expected low <= high, got low={low}, high={high}")
        if (high - low) % step:
            raise ValueError(
                f"integer {name!r} expected high - low divisible by step, "
                f"got low={low}, high={high}, step={step}"
            )
        return int(self._trial.suggest_int(name, low, high, step=step))

    def pow2(self, name: str, low: int, high: int) -> int:
        _check_name(name)
        return int(self._trial.suggest_categorical(name, pow2_choices(low, high)))

    def set_note(self, key: str, value: NoteValue) -> None:
        if not isinstance(key, str) or not key or key.startswith(ATTR_PREFIX):
            raise ValueError(
                f"expected a non-empty note key not starting with {ATTR_PREFIX!r}, got {key!r}"
            )
        if not isinstance(value, (str, int, float)):
            raise TypeError(
                f"note {key!r} expected a str, int or float value, got {type(value).__name__}"
            )
        self._trial.set_user_attr(key, value)
        self.notes[key] = value
