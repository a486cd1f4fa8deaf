"""The control channel from the orchestrator to the chief: one small JSON file, replaced
atomically, that the chief polls between steps.

``{"seq": n, "protocol": "asp" | "bsp" | null, "checkpoint": k}``: ``protocol`` overrides the
phase schedule's protocol in place (null = follow the schedule again); ``checkpoint`` increasing
asks for a checkpoint now (a preemption notice reached a parameter server). The orchestrator
keeps its own copy at ``<run_dir>/control.json`` and pushes every write to the chief's host
through the launch contract (``HostRunner.write_text``: temp file + rename on the host), at
``control.json`` in the chief host's work dir (``trainer.layout.CONTROL_FILE``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from provisioning.base import HostRunner, ProvisionError
from trainer.layout import CONTROL_FILE


class ControlChannel:
    """Writes the control file; every write bumps ``seq``. Not thread-safe (one supervisor)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.seq = 0
        self.protocol: str | None = None
        self.checkpoint = 0
        self._chief: HostRunner | None = None

    def attach(self, chief: HostRunner | None) -> None:
        """Push every write (and the current state, now) to this chief's host."""
        self._chief = chief
        if chief is not None:
            self._push(self.path.read_text() if self.path.exists() else self._text())

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

    def _text(self) -> str:
        return json.dumps({"seq": self.seq, "protocol": self.protocol,
                           "checkpoint": self.checkpoint}) + "\n"

    def _write(self) -> None:
        self.seq += 1
        text = self._text()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._push(text)

    def _push(self, text: str) -> None:
        if self._chief is not None:
            # a chief host that is gone reads nothing; recovery deals with the loss
            with contextlib.suppress(ProvisionError, OSError):  # lost, or out of contact
                self._chief.write_text(Path(CONTROL_FILE), text)
