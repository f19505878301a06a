"""A tqdm progress bar usable as ``Study.optimize(..., on_trial=...)``."""

from __future__ import annotations

from typing import Any

from ._records import TrialRecord, TrialState


class ProgressBar:
    """Counts trials, failed trials and shows the best value so far. Closes itself when
    ``total`` trials were seen; call ``close()`` (or use ``with``) otherwise."""

    def __init__(self, total: int | None, desc: str, **tqdm_kwargs: Any) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, unit="trial", **tqdm_kwargs)
        self._failed = 0

    def __call__(self, record: TrialRecord, best: TrialRecord | None) -> None:
        if record.state is TrialState.FAIL:
            self._failed += 1
        postfix = {"best": "-" if best is None or best.value is None else f"{best.value:.4g}"}
        if self._failed:
            postfix["failed"] = str(self._failed)
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)
        if self._bar.total is not None and self._bar.n >= self._bar.total:
            self.close()

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(total: int | None, desc: str, **tqdm_kwargs: Any) -> ProgressBar:
    """An ``on_trial`` callback drawing a tqdm bar of ``total`` trials (None: open-ended)."""
    return ProgressBar(total, desc, **tqdm_kwargs)
