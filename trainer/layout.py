"""The wire facts shared by the trainer, the orchestrator and the provisioning backends.

One TensorFlow-free, dependency-free module, so every side imports the same names instead of
repeating them: the run layout on a host (spec, control file, notice file, checkpoints, `DONE`,
TensorBoard, logs), role names, protocol names, the event prefix and the exit codes.
`orchestrator/` and `provisioning/` may import this module (and only this one) from `trainer/`.

Paths on a host are POSIX paths (every supported host runs Linux); a relative path in the spec
resolves against the role's working directory, which the runner sets to the host's work dir.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

# --- roles and protocols ----------------------------------------------------------------------
ROLE_PS = "ps"
ROLE_WORKER = "worker"
ROLE_CHIEF = "chief"
ROLE_EVALUATOR = "evaluator"
ROLES = (ROLE_PS, ROLE_WORKER, ROLE_CHIEF, ROLE_EVALUATOR)
CLUSTER_JOBS = (ROLE_PS, ROLE_WORKER, ROLE_CHIEF)  # the jobs of TensorFlow's cluster spec

PROTOCOL_BSP = "bsp"
PROTOCOL_ASP = "asp"
PROTOCOLS = (PROTOCOL_BSP, PROTOCOL_ASP)

# --- process protocol -------------------------------------------------------------------------
#: Stdout lines starting with this are events (Contract 2); everything else is log text.
EVENT_PREFIX = "@event "
#: The chief's exit code when it lost a parameter server (restartable from a checkpoint).
EXIT_PS_UNAVAILABLE = 3
#: 128 + SIGTERM, what a shell reports for a process ended by TERM.
EXIT_SIGTERM = 143
#: 128 + SIGINT: a process (trainer role, run, sweep, controller command) stopped by Ctrl-C.
EXIT_INTERRUPTED = 130
#: Environment variable every runner sets to the host's preemption-notice file (absolute path).
NOTICE_ENV = "TRANSIENT_PREEMPTION_NOTICE"
#: The role's lease (trainer/control.py `watch_lease`): the lease file's path, the generation
#: the role was started under, and how many seconds without a renewal end it.
LEASE_ENV, LEASE_TOKEN_ENV, LEASE_S_ENV = "TRANSIENT_LEASE", "TRANSIENT_LEASE_TOKEN", "TRANSIENT_LEASE_S"
#: A role's exit code when its lease lapsed or a newer generation replaced it.
EXIT_LEASE_LOST = 4

# --- the tool's version -----------------------------------------------------------------------
#: The tool's distribution, and the hosts' wheel (provisioning/ssh/setup.py builds it from
#: `trainer` alone, with the same version).
DISTRIBUTION = "transient-orchestrator"
HOST_DIST = "transient-orchestrator-host"


def tool_version() -> str:
    """The installed tool's version (on a host: the hosts' wheel's); a source tree that is not
    installed reads its own pyproject.toml; "unknown" when neither says. Standard library only,
    so the trainer on a host, without `orchestrator`, says the same version as its tool."""
    import tomllib
    from importlib import metadata
    from pathlib import Path

    for dist in (DISTRIBUTION, HOST_DIST):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def version_line(module: str) -> str:
    """``--version`` of a command that only runs as ``python -m module`` (no installed script):
    the trainer's, and the backends' that cannot import orchestrator/version.py."""
    return f"python -m {module} {tool_version()}"


# --- files of a run on a host -----------------------------------------------------------------
SPEC_FILE = "trainer_spec.json"
CONTROL_FILE = "control.json"
NOTICE_FILE = "PREEMPTION_NOTICE"
LEASE_FILE = "LEASE"  # the orchestrator renews it while the roles of this work dir are wanted
CHECKPOINT_DIR = "checkpoints"
DONE_MARKER = "DONE"  # in the checkpoint dir, written by the chief after the final save
TENSORBOARD_DIR = "tensorboard"
LOGS_DIR = "logs"


@dataclass(frozen=True)
class RunLayout:
    """Where a role's files are, below `root` (its run directory on its host).

    `checkpoint_dir` None = `<root>/checkpoints`; otherwise the storage location the spec names
    (an absolute folder the orchestrator owns on a local host, later a `gs://` prefix)."""

    root: str
    checkpoint_dir: str | None = None

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def spec(self) -> str:
        return self.path(SPEC_FILE)

    @property
    def control(self) -> str:
        return self.path(CONTROL_FILE)

    @property
    def checkpoints(self) -> str:
        return self.checkpoint_dir or self.path(CHECKPOINT_DIR)

    @property
    def done(self) -> str:
        return posixpath.join(self.checkpoints, DONE_MARKER)

    def tensorboard(self, kind: str) -> str:
        """`train` (the chief) or `eval` (the evaluator)."""
        return self.path(TENSORBOARD_DIR, kind)

    def log(self, role: str, index: int) -> str:
        return self.path(LOGS_DIR, f"{role}-{index}.log")
