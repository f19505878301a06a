"""A tqdm progress bar usable as ``Study.optimize(..., on_trial=...)``."""

from __future__ import annotations

from typing import Any

from ._records import TrialRecord, TrialState


def format_us(seconds: float | None) -> str:
    """A time in seconds shown in microseconds, as the report does: ``12.3µs``."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.4g}µs"


class ProgressBar:
    """Counts trials and failed trials and shows the best time so far, in µs. ``initial``,
    ``failed`` and ``best`` carry over what a resumed study already holds (see
    ``Study.progress_bar``). Closes itself when ``total`` trials were seen; call ``close()``
    (or use ``with``) otherwise."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        initial: int = 0,
        failed: int = 0,
        best: TrialRecord | None = None,
        **tqdm_kwargs: Any,
    ) -> None:
        from tqdm import tqdm

        self._failed = failed
        self._bar = tqdm(
            total=total,
            desc=desc,
            unit="trial",
            initial=initial,
            postfix=self._postfix(best),
            **tqdm_kwargs,
        )

    def __call__(self, record: TrialRecord, best: TrialRecord | None) -> None:
        if record.state is TrialState.FAIL:
            self._failed += 1
        self._show(best, record)
        self._bar.update(1)
        if self._bar.total is not None and self._bar.n >= self._bar.total:
            self.close()

    def _show(self, best: TrialRecord | None, last: TrialRecord | None = None) -> None:
        self._bar.set_postfix(self._postfix(best, last), refresh=False)

    def _postfix(self, best: TrialRecord | None, last: TrialRecord | None = None) -> dict:
        postfix = {"best": format_us(None if best is None else best.value)}
        if last is not None and last.value is not None:
            postfix["last"] = format_us(last.value)
        if self._failed:
            postfix["failed"] = str(self._failed)
        return postfix

    @property
    def n(self) -> int:
        """Trials counted so far (those of earlier runs included)."""
        return self._bar.n

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(
    total: int | None, desc: str, *, initial: int = 0, **tqdm_kwargs: Any
) -> ProgressBar:
    """An ``on_trial`` callback drawing a tqdm bar of ``total`` trials (None: open-ended),
    starting at ``initial``; ``Study.progress_bar`` fills ``initial`` from the study."""
    return ProgressBar(total, desc, initial=initial, **tqdm_kwargs)
