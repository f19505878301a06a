"""KernelBench through autofuse: the runner's command line (``run.py``, ``python -m
experiments.kernelbench``), the problems read by path and their CPU shape reduction
(``problems.py``), the child process that runs them one at a time (``worker.py``), the CPU mode's
correctness check (``check.py``), the GPU mode's timing (``gpu.py``) and the tables of runs
(``summary.py``, ``python -m experiments.kernelbench.summary``)."""
