"""Benchmarks and what they run: the public suite (``workloads.py``, ``suite_spec.py``, driver
``suite.py``), the model-style functions (``model_functions.py``, ``model_spec.py``), the
real-model suite (``models.py``, benchmark ``bench_models.py``), attention, serving, cold start,
host cost and a step's time by phase."""
