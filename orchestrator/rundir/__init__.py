"""The run directory, one folder with one owner: every file a run writes and every rule that
turns its events into results.

- ``results.py``: the names (every file and field, run statuses) and the writers (atomic files,
  the run's lock, the recorder that appends events and metrics);
- ``record.py``: the fold of a run's events over its attempts (:class:`record.RunState`) and the
  one builder of ``summary.json`` (:func:`record.summarize`), for a played, simulated, killed,
  resumed or preempted run alike;
- ``index.py``: a sweep's ``runs.csv``, marking a run whose orchestrator was killed, and a
  resume's repair of the index.

Both players (:mod:`orchestrator.runtime`, :mod:`orchestrator.simulate`) and the resume
(:mod:`orchestrator.resume`, which decides what to keep, resume or start) write through here;
:mod:`analysis` reads what it names.
"""
