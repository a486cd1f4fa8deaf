"""Where a detached sweep lives in Cloud Storage, and the controller's state record.

A detached sweep (``python -m orchestrator ... --detach``) runs on a controller VM; everything
the user's machine and the controller share is under one prefix of the bucket the run already
uses (``provider.storage``), so no port is opened and no new service runs::

    gs://BUCKET/PREFIX/sweeps/<sweep_id>/
      submit/command.json   what to run: the overrides, the provider section, the sweep folder
      submit/repo.tar.gz    the user's experiments/ and conf/ as the command saw them
      submit/<wheel>        this tool, as installed on the user's machine
      data/                 a job.data_dir of the user's machine, uploaded once
      sweep/                the sweep folder, file for file (multirun.yaml, runs.csv, <n>/...)
      console.log           what the orchestrator printed, as it would have on a terminal
      controller.json       the controller's state (phase, VM, heartbeat), ControllerState
      cancel                present: the user asked the sweep to stop

This module is the one definition of those names; it imports nothing of Google's.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SWEEPS = "sweeps"
SUBMIT = "submit"
COMMAND_FILE = "command.json"
REPO_ARCHIVE = "repo.tar.gz"
DATA = "data"
MIRROR = "sweep"
CONSOLE_FILE = "console.log"
STATE_FILE = "controller.json"
CANCEL_FILE = "cancel"

#: The controller's phases, in order; the last three are terminal.
SUBMITTED, BOOTING, RUNNING, CANCELLING = "submitted", "booting", "running", "cancelling"
DONE, FAILED, CANCELLED = "done", "failed", "cancelled"
PHASES = (SUBMITTED, BOOTING, RUNNING, CANCELLING, DONE, FAILED, CANCELLED)
TERMINAL = frozenset({DONE, FAILED, CANCELLED})

#: The controller writes its state at least this often while it runs (its heartbeat); a state
#: older than a few of these, with the VM gone, is a dead controller.
HEARTBEAT_S = 10.0

_ID = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
_SWEEP_URL = re.compile(r"(gs://[^/]+(?:/.+?)?)/" + SWEEPS + r"/([^/]+)/?")


def new_sweep_id(experiment: str | None, now: float | None = None) -> str:
    """``<experiment>-<yyyymmdd-hhmmss>-<4 hex>``: unique, and a valid GCE name part and
    label value (lowercase, digits, `-`; at most 40 characters)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    tail = f"-{stamp}-{secrets.token_hex(2)}"
    name = re.sub(r"[^a-z0-9]+", "-", (experiment or "sweep").lower()).strip("-") or "sweep"
    if not name[0].isalpha():
        name = "s-" + name
    return name[: 40 - len(tail)].rstrip("-") + tail


def sweep_id_problem(sweep_id: str) -> str | None:
    """Why `sweep_id` cannot name a detached sweep, or None."""
    if not _ID.fullmatch(sweep_id):
        return (f"{sweep_id!r} is not a sweep id (lowercase letters, digits and '-', starting "
                "with a letter, at most 40 characters)")
    return None


@dataclass(frozen=True)
class SweepUrls:
    """The objects of one detached sweep under ``<storage>/sweeps/<sweep_id>``."""

    storage: str  # provider.storage: gs://BUCKET[/PREFIX]
    sweep_id: str

    @classmethod
    def parse(cls, url: str) -> SweepUrls:
        """From ``gs://BUCKET[/PREFIX]/sweeps/<id>`` (what `--detach` prints); ValueError
        for anything else."""
        match = _SWEEP_URL.fullmatch(url.strip())
        if not match:
            raise ValueError(f"{url!r} is not a detached sweep's URL (expected "
                             f"gs://BUCKET/PREFIX/{SWEEPS}/SWEEP_ID)")
        problem = sweep_id_problem(match.group(2))
        if problem:
            raise ValueError(problem)
        return cls(match.group(1), match.group(2))

    @property
    def root(self) -> str:
        return f"{self.storage.rstrip('/')}/{SWEEPS}/{self.sweep_id}"

    def child(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    @property
    def submit(self) -> str:
        return self.child(SUBMIT)

    @property
    def data(self) -> str:
        return self.child(DATA)

    @property
    def mirror(self) -> str:
        return self.child(MIRROR)

    def __str__(self) -> str:
        return self.root


@dataclass
class Command:
    """``submit/command.json``: what the controller runs, written once by the user's side.

    `overrides` are the command line's Hydra arguments as the controller must run them (the
    user's, with what only made sense on the user's machine rewritten: a local data folder
    becomes its upload, the login key is the controller's own); `sweep_dir` is the sweep
    folder relative to the command's folder, the same on both machines, so `pull` puts the
    files where an attached run would have; `provider` is the composed provider section (the
    controller's Compute and Storage settings); `env` the variables of the Google clients that
    name a local stand-in (never credentials); `resume`: continue the sweep in `sweep/` with
    ``--resume`` instead of starting it."""

    sweep_id: str
    overrides: list[str]
    sweep_dir: str
    provider: dict[str, Any]
    wheel: str | None = None  # the tool's wheel in submit/; None: `version` from the index
    version: str = ""  # the submitting tool's version (an installed tool's controller gets it)
    env: dict[str, str] = field(default_factory=dict)
    resume: bool = False
    submitted_by: str = ""  # user@host of the submitting machine, for status
    submitted_at: float = 0.0
    controller_vm: str = ""
    controller_zone: str = ""
    controller_usd_per_hour: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def gce_config(self):  # -> provisioning.gce.config.GceConfig (no Google import)
        """The provider section as the typed config: the Compute and Storage settings of
        everything acting on the controller's VM and the bucket."""
        from provisioning.gce.config import from_section

        return from_section(self.provider)

    @classmethod
    def from_json(cls, text: str) -> Command:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ControllerState:
    """``controller.json``: the controller's phase and heartbeat (`updated`, unix seconds).

    Written by the user's side at submit (`submitted`), then by the controller (`booting` while
    it installs, `running` with the orchestrator's pid, `cancelling`, and a terminal phase with
    the orchestrator's exit code). `vm`/`zone` name the controller VM; `started`: when it began
    running (its cost counts from there)."""

    phase: str
    updated: float
    vm: str = ""
    zone: str = ""
    started: float | None = None
    exit_code: int | None = None
    message: str = ""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    def age_s(self, now: float | None = None) -> float:
        return (now if now is not None else time.time()) - self.updated

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ControllerState:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
