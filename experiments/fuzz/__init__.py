"""A differential fuzzer of autofuse: random small programs (``generate.py``, op forms in
``forms_basic.py`` / ``forms_more.py``) through both front ends against eager
(``compare.py``, in a child process: ``worker.py``), failures shrunk (``shrink.py``) to
standalone reproductions (``repro.py``), the run recorded (``record.py``); the command line is
``python -m experiments.fuzz`` (``driver.py``)."""
