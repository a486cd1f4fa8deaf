"""A full disk under the run directory ends the run at once with one line naming the folder and
the cause, never spending a restart (issue 35).

The disk is real: a tmpfs of 64 KiB mounted on the folder and filled up, so every write there
fails with ENOSPC exactly as on a full disk (RLIMIT_FSIZE would give EFBIG instead). Mounting
needs root, as CI has; each mount is undone by the fixture."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.orchestrator.proc_utils import live_processes_mentioning
from tests.orchestrator.test_run_local import orchestrate, read_events
from trainer.events import DISK_FULL, disk_full_fields, is_disk_full


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """``full_disk(folder)``: mount a 64 KiB tmpfs on `folder` and fill it."""
    mounted: list[Path] = []

    def make(folder: Path) -> Path:
        if os.geteuid() != 0:
            pytest.fail("mounting a small tmpfs needs root (CI runs these tests as root)")
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                       check=True)
        mounted.append(folder)
        with open(folder / ".fill", "wb", buffering=0) as f, pytest.raises(OSError) as info:
            while True:
                f.write(b"\0" * 4096)
        assert info.value.errno == errno.ENOSPC
        return folder

    yield make
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_is_recognised_and_its_folder_named(full_disk, tmp_path: Path) -> None:
    full = full_disk(tmp_path / "full")
    with pytest.raises(OSError) as info, open(full / "x", "w") as f:
        f.write("x" * 100_000)
    assert is_disk_full(info.value)
    fields = disk_full_fields(info.value, [str(tmp_path), str(full)])
    assert fields["error_kind"] == DISK_FULL and fields["path"] == str(full)
    assert fields["free_bytes"] == 0
    assert disk_full_fields(FileNotFoundError(errno.ENOENT, "gone"), [str(full)]) == {}


def test_the_orchestrators_own_write_to_a_full_run_folder_is_one_line(
        full_disk, repo_root: Path, tmp_path: Path) -> None:
    run_dir = full_disk(tmp_path / "run")
    done = orchestrate(repo_root, "+experiment=digits_local", "progress=false",
                       f"hydra.run.dir={run_dir}", timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [f"disk full: the orchestrator could not write in {run_dir} (0.0 MB free): "
                     "No space left on device; stopped without a restart (it would write to "
                     "the same disk): free space there and run again"], done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_a_role_on_a_full_disk_ends_the_run_without_a_restart(
        full_disk, repo_root: Path, tmp_path: Path) -> None:
    """The chief cannot write its checkpoints: the run fails at once naming that folder, with
    restarts allowed and none spent, and nothing left running."""
    run_dir = tmp_path / "run"
    checkpoints = full_disk(run_dir / "checkpoints")
    done = orchestrate(repo_root, "+experiment=digits_local", "job.train_steps=200",
                       "job.checkpoint_frequency=50", "job.eval_frequency=0",
                       "cluster.recovery.max_restarts=2", "progress=false",
                       f"hydra.run.dir={run_dir}")
    assert done.returncode == 1, done.stderr[-3000:]
    expected = f"disk full: chief 0 could not write in {checkpoints} (0.0 MB free)"
    assert f"error: {expected}" in done.stdout, done.stdout[-3000:]
    events = read_events(run_dir)
    assert not [e for e in events if e["kind"].startswith("recovery")], events
    assert [e["kind"] for e in events].count("start") == 1  # one deployment, no second one
    assert not live_processes_mentioning(str(run_dir))
