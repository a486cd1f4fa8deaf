"""The control channel from the orchestrator to the chief: one small JSON file, replaced
atomically, that the chief polls between steps.

``{"seq": n, "protocol": "asp" | "bsp" | null, "checkpoint": k}``: ``protocol`` overrides the
phase schedule's protocol in place (null = follow the schedule again); ``checkpoint`` increasing
asks for a checkpoint now (a preemption notice reached a parameter server). The same file can be
pushed to a remote chief with the launch contract's ``copy``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONTROL_FILE = "control.json"


class ControlChannel:
    """Writes the control file; every write bumps ``seq``. Not thread-safe (one supervisor)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.seq = 0
        self.protocol: str | None = None
        self.checkpoint = 0

    def set_protocol(self, protocol: str | None) -> None:
        """Override the schedule's protocol (None = follow the schedule)."""
        self.protocol = protocol
        self._write()

    def request_checkpoint(self) -> None:
        self.checkpoint += 1
        self._write()

    def reset(self) -> None:
        """A restarted chief starts from the schedule: drop any override."""
        self.protocol = None
        self._write()

    def _write(self) -> None:
        self.seq += 1
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seq": self.seq, "protocol": self.protocol,
                                   "checkpoint": self.checkpoint}) + "\n")
        os.replace(tmp, self.path)
