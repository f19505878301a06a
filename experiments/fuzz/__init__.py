"""A differential fuzzer of autofuse: random small programs (``generate.py``, op forms in
``forms_basic.py`` / ``forms_more.py`` / ``forms_arith.py`` / ``forms_order.py`` /
``forms_shape.py``) through both front ends against eager on the CPU or a GPU (``compare.py``,
in a child process: ``worker.py``), failures shrunk (``shrink.py``) to standalone
reproductions (``repro.py``), the run recorded (``record.py``); the command line is
``python -m experiments.fuzz`` (``driver.py``; shards at once: ``jobs.py``)."""
