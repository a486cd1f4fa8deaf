"""The launch contract: how a role is started on a host and files move to and from it
(`HostRunner`, `RemoteProcess`), where a backend journals what it creates (`ResourceJournal`) and
where a run's checkpoints are kept durable (`CheckpointStore`). `provisioning.base` re-exports
every name and describes the contract as a whole (the preemption-notice channel included)."""

from __future__ import annotations

import abc
import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from provisioning.records import Host, HostId, ProvisionError
from trainer import layout

#: Grace between SIGTERM and SIGKILL when a runner stops its processes.
STOP_GRACE_S = 5.0
#: File name of the preemption notice inside a machine's work dir (see module docstring).
PREEMPTION_NOTICE_FILE = layout.NOTICE_FILE
#: Environment variable holding the notice file's absolute path for every started process.
PREEMPTION_NOTICE_ENV = layout.NOTICE_ENV


# --- processes and runners ----------------------------------------------------------------------


class RemoteProcess(abc.ABC):
    """A process started by a `HostRunner`: its stdout is piped back to the caller."""

    @property
    @abc.abstractmethod
    def pid(self) -> int:
        """Process id on its host (for local hosts also its process-group id)."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """Exit code, or None while it runs. Negative codes are signals (-9 = SIGKILL)."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> int:
        """Block until exit and return the exit code; None waits forever.

        Raises TimeoutError if it still runs after `timeout_s`."""

    @abc.abstractmethod
    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its process group). No-op once it has exited."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop it now (SIGKILL to its process group). No-op once it has exited."""

    @abc.abstractmethod
    def readline(self) -> str:
        """Next stdout line including its newline; '' at end of output."""

    def stdout_lines(self) -> Iterator[str]:
        """Stdout lines without trailing newlines, until the process closes stdout."""
        while line := self.readline():
            yield line.rstrip("\r\n")


class HostRunner(abc.ABC):
    """Runs commands on one host and moves files to and from it. Every provider's hosts give
    one; the deployer needs no more. Host paths are POSIX paths on the host; a relative one is
    relative to `host.workdir`.

    Backends implement `_launch`, `copy`, `fetch`, `alive`, `stop_all` and `notice_path`, and
    may override `setup`, `trainer_command` and `trainer_env`; `start` and `write_text` are the
    contract's own and not overridden."""

    host: Host
    #: True when host paths are paths on the orchestrator's own machine (the local backend):
    #: then the chief may write checkpoints straight into the orchestrator's folder.
    shares_orchestrator_fs: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def notice_path(self) -> Path:
        """Absolute host path of the preemption-notice file of this host's machine."""

    def setup(self) -> None:
        """Make `trainer_command()` runnable on the host (environment, this project's code).

        Idempotent and cached: a second call (or run) on a ready host does nothing costly.
        Called once per host before its first role starts. Default: nothing to do."""
        return None

    @abc.abstractmethod
    def trainer_command(self) -> list[str]:
        """The argv prefix that runs `python -m trainer` on this host (the host's interpreter,
        not the orchestrator's), e.g. `["/opt/env/bin/python", "-m", "trainer"]`."""

    def trainer_env(self) -> dict[str, str]:
        """Environment the trainer needs on this host besides the contract's (e.g. PYTHONPATH
        of a checkout). Default: none."""
        return {}

    def dataset_cache(self) -> Path | None:
        """Absolute host folder that outlives runs on this machine, where the deployer keeps
        datasets (`<root>/datasets` on an SSH host or VM), so a second run or a restart finds
        them there. None (the default): datasets go under the work dir, kept for the run."""
        return None

    def bytes_sent(self) -> int | None:
        """Bytes sent from the orchestrator's machine to this host's machine so far (files,
        commands, everything on the link), None where nothing crosses a link (`local`) or it
        is not counted. The deployer records each machine's figure per deployment."""
        return None

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        log_path: Path | None = None,
    ) -> RemoteProcess:
        """Start `argv` on the host in its own process group; stdout is piped back to the
        caller, stderr appended to `log_path` (a path on the orchestrator: remote runners
        stream it back). The process finds the notice file in `TRANSIENT_PREEMPTION_NOTICE`.

        `env` is added to the host's default environment; `cwd` None = the host's work dir;
        `log_path` None discards stderr. Raises HostLostError if the host is gone."""
        full_env = {**(env or {}), PREEMPTION_NOTICE_ENV: str(self.notice_path)}
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        return self._launch(argv, full_env, cwd, log_path)

    @abc.abstractmethod
    def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        log_path: Path | None,
    ) -> RemoteProcess:
        """`start` without the contract's part: `env` already holds the notice variable."""

    @abc.abstractmethod
    def copy(self, local: Path, remote: Path) -> None:
        """Copy a file or directory from the orchestrator machine onto the host.

        A file is replaced atomically (written beside the target, then renamed), so a role
        polling it never reads half of it. Parent directories are created.
        A relative `remote` is relative to the host's work dir. Raises HostLostError."""

    def write_text(self, remote: Path, text: str) -> None:
        """Write `text` to the host file `remote`, atomically (through `copy`)."""
        fd, tmp = tempfile.mkstemp(prefix=".put-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            self.copy(Path(tmp), remote)
        finally:
            os.unlink(tmp)

    @abc.abstractmethod
    def fetch(self, remote: Path, local: Path) -> bool:
        """Copy a host file or directory (recursively, merging) to `local` on the orchestrator.

        Returns False when `remote` does not exist; raises HostLostError if the host is gone.
        Used at the end of a run and on failure (TensorBoard, role files)."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """True while the host can run commands (not revoked, not released)."""

    @abc.abstractmethod
    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every process this runner started: SIGTERM, `grace_s`, then SIGKILL; reap.

        Idempotent, and safe on a revoked or released host."""


class ResourceJournal(Protocol):
    """Where a backend records every resource before (or as) it exists, so a crashed run can be
    cleaned up later by `Provider.clean_up`. Implemented by `provisioning.journal.Journal`.
    Every entry carries the backend's name and the host (id and address): a pid means nothing
    without the machine it lives on. `start_ticks` (the process's start time on its host, when
    the backend can read it) guards clean-up against pid reuse."""

    def record_process_group(
        self, *, backend: str, host_id: HostId, address: str, pid: int, pgid: int,
        argv: Sequence[str], start_ticks: int | None = None,
    ) -> None: ...

    def record_process_group_released(
        self, *, backend: str, host_id: HostId, address: str, pgid: int
    ) -> None: ...


# --- the checkpoint store ---------------------------------------------------------------------


class CheckpointStore(abc.ABC):
    """Where a run's checkpoints live, so that losing any one host loses none of them.

    The chief writes checkpoints (and `DONE`) where the spec's `checkpoint_dir` says; on a
    restart, possibly on other hosts, the new chief resumes from the newest one it finds there.
    A store decides that location for a given chief host and keeps it durable; the provider
    hands the run its store (`Provider.checkpoint_store`). A checkpoint that was still only on a
    host when that host was lost is lost with it; the run resumes from the last one synced."""

    @abc.abstractmethod
    def location(self, chief: HostRunner) -> str:
        """The spec's `checkpoint_dir` for a cluster whose chief runs on `chief`'s host."""

    @abc.abstractmethod
    def before_start(self, chief: HostRunner) -> None:
        """Make the latest checkpoint readable at `location(chief)` before the chief starts."""

    @abc.abstractmethod
    def sync(self, chief: HostRunner) -> bool:
        """Make what the chief wrote durable; False if nothing could be brought back."""

    def finish(self, run_dir: Path) -> None:
        """Once the run has ended (summary written): archive what the store keeps durable
        elsewhere (the bucket store uploads the run directory). Default: nothing."""
        return None


class LocalFolderStore(CheckpointStore):
    """A folder on the orchestrator's machine (`<run_dir>/checkpoints`), the default store.

    A chief whose host shares the orchestrator's filesystem (`HostRunner.shares_orchestrator_fs`,
    the local backend) writes straight into it. Any other chief writes into `checkpoints/` in
    its host's work dir; the fleet calls `sync` after each `checkpoint` event, which fetches the
    folder back through the runner, and `before_start` copies the store onto a new chief's host
    before it starts, so it resumes from the latest checkpoint whichever host it is on."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def location(self, chief: HostRunner) -> str:
        if chief.shares_orchestrator_fs:
            return str(self.folder.resolve())
        return str(chief.host.workdir / layout.CHECKPOINT_DIR)

    def before_start(self, chief: HostRunner) -> None:
        if not chief.shares_orchestrator_fs and any(self.folder.iterdir()):
            chief.copy(self.folder, Path(layout.CHECKPOINT_DIR))

    def sync(self, chief: HostRunner) -> bool:
        if chief.shares_orchestrator_fs:
            return True
        with contextlib.suppress(ProvisionError, OSError):  # lost, or out of contact
            return chief.fetch(Path(layout.CHECKPOINT_DIR), self.folder)
        return False


@dataclass(frozen=True)
class StagedDataset:
    """Where a dataset lies in a `DatasetStore` for the hosts to download, and what putting it
    there sent from the orchestrator's machine (0 when the store already held every file)."""

    url: str
    uploaded_files: int = 0
    uploaded_bytes: int = 0


class DatasetStore(abc.ABC):
    """Storage near the hosts that they download a dataset from themselves (gce: the bucket of
    `provider.storage`; `Provider.dataset_store`), so a folder on the orchestrator's machine
    crosses the user's uplink at most once per run instead of once per host. The host side is
    `python -m trainer data` with `host_args`, which answers with one ``@data`` line."""

    @abc.abstractmethod
    def stage(self, local_dir: Path, files: Mapping[str, Sequence[Any]]) -> StagedDataset:
        """Upload what of `files` (`local_dir`'s ``{relative path: [size, sha256]}``) the
        store lacks, under a location named by their content, so a second run or a restart
        uploads nothing. Raises ProvisionError (one line) when it cannot."""

    def reads(self, url: str) -> bool:
        """Whether hosts download a `job.data_dir` URL themselves (gce: any ``gs://``), so its
        copy on the orchestrator's machine need not be pushed. Default: False."""
        return False

    @abc.abstractmethod
    def host_args(self, url: str, manifest: str, dest: str, link: str) -> list[str]:
        """The arguments of `python -m trainer data` that make a host fill its folder `dest`
        from `url`, each file verified against the JSON `manifest` (a host path, same shape as
        `stage`'s `files`), then point `link` at `dest`."""
