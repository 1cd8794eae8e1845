"""Fault campaigns for millwheel: a checker, the faults it can inject, and the checkable topology.

* :mod:`faults.ledger` — the *ledger*, a two-stage topology over generated Zeitgeist-like
  input (duplicates, malformed lines, late records planted) whose answer is a function of
  the input: every valid id once, in its window, under its key;
* :mod:`faults.check` — ``millwheel check RUN``: lost, duplicated and unseen records, per-key
  sequence breaks, published low watermarks that went back, early low-watermark timers,
  output visible from uncommitted batches;
* :mod:`faults.inject` — the faults: kill -9 of the driver, of Spark's Python workers, of an
  executor JVM, of the watermark authority; a zombie driver; a full disk; a wall-clock jump;
* :mod:`faults.driver` — the driver process the faults are injected into;
* :mod:`faults.campaign` — a randomised campaign of faults, seeded, with the checker at the end
  (``tests/faults/test_campaign.py`` in CI, ``bench/soak.py`` for hours).

See ``docs/reliability.md``. Nothing in ``millwheel/`` imports this package.
"""
