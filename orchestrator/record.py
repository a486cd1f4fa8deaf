"""The run record: what a run's events add up to, and the one ``summary.json`` they make.

Both players of a plan, the real run (:mod:`orchestrator.runtime`) and the model
(:mod:`orchestrator.simulate`), record the same events; this module is the only code that turns
events into a summary.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from orchestrator import results

#: Measured summary fields compared with the prediction band's median (``prediction_error``).
PREDICTION_COMPARED = ("wall_time_s", "train_time_s")


def make_run_id(name: str) -> str:
    """A run's id: the experiment's name, the start time and a random suffix (unique even for
    runs started in the same second, as a sweep's are)."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def prediction_error(band: dict[str, Any] | None, summary: dict[str, Any]
                     ) -> dict[str, float] | None:
    """``(predicted median − measured) / measured`` per compared field (+0.10: predicted 10 %
    too long), for a completed run with a band of this very run; None otherwise."""
    if (not band or "unavailable" in band or band.get("stand_in")
            or summary.get("status") != results.STATUS_COMPLETED):
        return None
    errors = {}
    for name in PREDICTION_COMPARED:
        measured = summary.get(name)
        if measured and name in band:
            errors[name] = round((band[name]["p50"] - measured) / measured, 4)
    return errors or None
