"""Process isolation: another measurer runs in a spawned worker with time-outs, so a hanging or
crashing kernel scores as a failure and the search goes on."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from autofuse import logs
from autofuse.ir.graph import Graph
from autofuse.measure import worker
from autofuse.measure.candidate import (
    Candidate,
    Measurement,
    eager_subgraph,
)
from autofuse.measure.cost_model import CostModel

# ---------------------------------------------------------------------------------------------
# Isolation in a worker process
# ---------------------------------------------------------------------------------------------


def _spec_source(spec: Any) -> str:
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        return "modeled" if spec[0] == "cost_model" else "measured"
    return getattr(spec, "source", "measured")


def _child_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k.startswith("AUTOFUSE_") or k == "TRITON_INTERPRET" or k == "CUDA_VISIBLE_DEVICES"
    }


class Isolated:
    """Runs an inner measurer in a worker process (``spawn``: fresh CUDA state).

    ``inner_spec`` is how the worker builds it: ``("cost_model", kwargs)``, ``("gpu", kwargs)``,
    ``("package.module:factory", kwargs)``, or a picklable measurer object. A job that runs
    past ``timeout_s`` (counted from when the worker received it) gets its worker killed and
    scores ``"timeout after N s"``; a worker that dies mid-job scores ``"worker died: exit code
    ..."``. Either way the next job starts a fresh worker. After a CUDA error the worker reports
    it and exits, since its CUDA context is unusable.
    """

    def __init__(self, inner_spec: Any, timeout_s: float = 60, start_timeout_s: float = 300):
        worker.check_spec(inner_spec)
        self.spec = inner_spec
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.source = _spec_source(inner_spec)
        self.restarts = 0  # workers started after the first
        self._timed_out = False
        self._starts = 0
        self._proc: Any = None
        self._conn: Any = None
        self._job = 0

    # -- worker lifecycle --------------------------------------------------------------------
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def start(self) -> None:
        """Start the worker (if none is running) and wait until it is ready for jobs."""
        if self.alive():
            return
        if self._proc is not None:
            self._discard()
        if self._starts:
            self.restarts += 1
        self._starts += 1
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=worker.main, args=(child, self.spec, _child_env()), daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        msg = self._recv(self.start_timeout_s)
        if msg is None or msg[0] != "ready":
            why = self._death_reason() if msg is None else msg[1]
            self._discard()
            raise RuntimeError(f"measurement worker failed to start: {why}")

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                self._conn.send(("stop",))
                self._proc.join(5)
        except Exception:  # noqa: BLE001
            pass
        self._discard()

    def __enter__(self) -> Isolated:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _discard(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(10)
        if conn is not None:
            conn.close()

    def _death_reason(self) -> str:
        proc = self._proc
        if proc is None:
            return "worker died"
        proc.join(2)
        code = proc.exitcode
        if code is None:
            return "worker stopped answering"
        if code < 0:
            try:
                import signal

                return f"worker died: exit code {code} ({signal.Signals(-code).name})"
            except ValueError:
                pass
        return f"worker died: exit code {code}"

    def _recv(self, timeout: float) -> tuple | None:
        """The next message, or None when the worker died or ``timeout`` passed (then
        ``self._timed_out`` is set)."""
        self._timed_out = False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out = True
                return None
            try:
                if self._conn.poll(min(left, 0.2)):
                    return self._conn.recv()
            except (EOFError, OSError):
                return None
            if not self._proc.is_alive() and not self._conn.poll(0):
                return None

    # -- jobs --------------------------------------------------------------------------------
    def _run(self, kind: str, payload: Any) -> tuple[Any, str | None]:
        """(result, None) or (None, failure reason)."""
        try:
            self.start()
        except RuntimeError as e:
            return None, str(e)
        self._job += 1
        job = self._job
        try:
            self._conn.send((kind, job, payload))
        except (BrokenPipeError, OSError):
            self._discard()
            return None, "worker died: the job could not be sent"
        msg = self._recv(self.start_timeout_s)
        if msg is None or msg[0] != "started":
            why = self._death_reason() if msg is None else f"unexpected worker message {msg[0]}"
            self._discard()
            return None, why
        while True:
            msg = self._recv(self.timeout_s)
            if msg is None:
                why = (
                    f"timeout after {self.timeout_s:g} s"
                    if self._timed_out
                    else self._death_reason()
                )
                self._discard()
                return None, why
            if msg[0] == "result" and msg[1] == job:
                return msg[2], None

    def measure(self, candidate: Candidate) -> Measurement:
        result, why = self._run("measure", candidate.standalone())
        if why is not None:
            return Measurement.failed(why, self.source)
        return result

    def eager_time(self, graph: Graph, i: int) -> float:
        """Time of eager op ``i`` from the inner measurer (modeled if it has none)."""
        result, why = self._run("eager", eager_subgraph(graph, i))
        if why is not None or not isinstance(result, float):
            logs.log.warning("eager op %%%d not timed in the worker (%s): modeled", i, why)
            return CostModel().eager_time(graph, i)
        return result
