"""Programs checked in a child process, so that a program that kills its process (a heap
corruption, an abort) or hangs past its time-out is recorded, and the run goes on in a fresh
child.

The child (``python -m experiments.fuzz.worker``) reads one request a line on stdin (a program,
the mode, one front end, the time-out, the device, TF32 on or off) and answers one line
starting ``FUZZ-RESULT``; other output of the child is ignored.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments.fuzz.compare import EagerRejected, Verdict, check_program
from experiments.fuzz.program import Program

PREFIX = "FUZZ-RESULT "
HARD_SLACK_S = 60.0  # beyond the in-process time-out, before the child is killed


def set_tf32(on: bool) -> None:
    """TF32 for eager's float32 matmuls and convolutions (cuBLAS, cuDNN) on or off."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def cuda_fault(res: dict) -> bool:
    """Whether a check's answer tells of a CUDA fault (a device-side assert in eager, as an
    index out of range raises on a GPU, or in a kernel): the child's CUDA context is unusable
    after it, so every later check would fail alike."""
    text = (res.get("eager_rejected") or "") + ((res.get("verdict") or {}).get("detail") or "")
    return any(s in text for s in ("CUDA error", "device-side assert", "AcceleratorError"))


class Worker:
    """A child process checking programs one at a time, on ``device`` (TF32 off unless
    ``tf32``); started again after it dies, and after a CUDA fault (``cuda_fault``)."""

    def __init__(
        self,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        device: str = "cpu",
        tf32: bool = False,
    ) -> None:
        self.log = log
        self.env = env
        self.device = device
        self.tf32 = tf32
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def start(self) -> None:
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, **(self.env or {})}
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.fuzz.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=root, env=env,
        )  # fmt: skip
        self.buf = b""

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def check(self, p: Program, backward: bool, front_end: str, timeout_s: float) -> dict:
        """{"eager_rejected": reason or None, "verdict": Verdict fields or None}."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        req = {"program": p.to_json(), "backward": backward, "front_end": front_end,
               "timeout": timeout_s, "device": self.device, "tf32": self.tf32}  # fmt: skip
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            line = self._read_line(time.monotonic() + timeout_s + HARD_SLACK_S)
        except BrokenPipeError:
            line = None
        if line is not None:
            res = json.loads(line[len(PREFIX) :])
            if cuda_fault(res):
                self.close()
            return res
        died = self.proc.poll()
        self.close()
        mode = "backward" if backward else "forward"
        secs = round(time.perf_counter() - t0, 2)
        if died is None:
            v = Verdict(front_end, mode, "timeout", detail="hard time-out: child killed",
                        seconds=secs)  # fmt: skip
        else:
            v = Verdict(front_end, mode, "crash", error="ProcessDied",
                        detail=f"the checking process died (exit status {died})", seconds=secs)  # fmt: skip
        return {"eager_rejected": None, "verdict": asdict(v)}

    def _read_line(self, deadline: float) -> str | None:
        """The next ``FUZZ-RESULT`` line, or None at EOF or past ``deadline``."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                while b"\n" in self.buf:
                    raw, self.buf = self.buf.split(b"\n", 1)
                    text = raw.decode(errors="replace")
                    if text.startswith(PREFIX):
                        return text
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.buf += chunk
        finally:
            sel.close()


def serve(req: dict[str, Any]) -> dict:
    p = Program.from_json(req["program"])
    device = req.get("device", "cpu")
    set_tf32(req.get("tf32", False))
    try:
        (v,) = check_program(p, req["backward"], [req["front_end"]], req["timeout"], device=device)
    except EagerRejected as e:
        return {"eager_rejected": str(e)[:300], "verdict": None}
    return {"eager_rejected": None, "verdict": asdict(v)}


def main() -> None:
    import autofuse  # noqa: F401 - the backend registered, the interpreter chosen

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the checked code prints goes to the log, not into the answers
    for line in sys.stdin:
        if line.strip():
            out.write(PREFIX + json.dumps(serve(json.loads(line))) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
