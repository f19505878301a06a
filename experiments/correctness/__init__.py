"""Correctness sweeps against eager: PyTorch's OpInfo database through the backend
(``opinfo_sweep.py``, with ``opinfo_check.py`` and ``opinfo_expected.py``) and how the model
benchmark judges gradients (``model_grads.py``); the differential fuzzer is ``experiments.fuzz``."""
