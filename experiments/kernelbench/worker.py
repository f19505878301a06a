"""A child process that runs KernelBench problems one at a time, each bounded by a time-out.

The parent writes a problem number per line to the child's stdin; the child prints
``kernelbench-done <n>`` when that problem's record is written. A problem that runs past its
time-out gets the child (and everything it started) killed, and the next problem a fresh child:
one problem cannot eat the run, and the import of torch and the GPU's start-up are paid once per
child, not once per problem. A child exits after a problem that raised (the process may be left
in a bad state, a GPU context after a device fault); the parent starts another.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

DONE = "kernelbench-done"


class Worker:
    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        return self.proc

    def run(self, number: int, timeout: float) -> tuple[str | None, str]:
        """(None, log) when problem ``number`` finished; ("timeout" | "crash", log) else."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{number}\n".encode())
            proc.stdin.flush()
        except BrokenPipeError:
            return "crash", ""
        marker = f"\n{DONE} {number}\n"
        log, deadline, fd = "", time.monotonic() + timeout, proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                return "timeout", log
            ready, _, _ = select.select([fd], [], [], min(left, 5.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16).decode(errors="replace")
            if not chunk:
                self.stop()
                return "crash", log
            log = (log + chunk)[-20000:]
            if marker in log:
                return None, log.replace(marker, "")

    def stop(self) -> None:
        """Kill the child and everything it started (its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def serve(run_problem) -> None:
    """The child's loop: ``run_problem(number)`` per line of stdin (returns whether it went
    without an exception), the marker after each; exits after one that raised."""
    import sys

    for line in sys.stdin:
        number = int(line)
        ok = run_problem(number)
        print(f"\n{DONE} {number}", flush=True)
        if not ok:
            return
