"""A machine lost after it was acquired and before the first training step is a loss like any
other (audit S1): the supervisor owns the first deployment (`Supervisor.deploy`) and hands
such a loss to the recovery policies: a worker is replaced or the cluster shrinks without it
(`cluster.recovery.on_revocation`), the PS's machine is re-acquired (a restart from
checkpoint at step 0), and the run completes. The machines are the local backend's, taken with
its own revocation (`Provider.revoke`, no notice: processes killed, poll says REVOKED) at the
moment the deployer sets one up or has just started its role; the roles are
tests/orchestrator/fake_role.py under the real deployer and supervisor (tests/orchestrator/
test_supervisor.py's `FakeRun`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioning.base import Host, Role
from provisioning.local import LocalHostRunner, LocalProvider
from tests.orchestrator.test_supervisor import FakeRun


def taken_at(moment: str, slot: str) -> type[LocalProvider]:
    """The local backend whose machine of host `slot` (e.g. worker-1) is revoked once: when
    the deployer sets it up (`moment` "setup") or has just started its role ("start")."""
    taken: list[Host] = []

    class Provider(LocalProvider):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            Runner.provider = self

    class Runner(LocalHostRunner):
        provider: LocalProvider

        def setup(self) -> None:
            super().setup()
            self._take("setup")

        def start(self, *args: Any, **kwargs: Any) -> Any:
            process = super().start(*args, **kwargs)
            self._take("start")
            return process

        def _take(self, now: str) -> None:
            if now == moment and self.host.spec.name == slot and not taken:
                taken.append(self.host)
                self.provider.revoke(self.host, 0.0)

    Provider.runner_class = Runner
    Provider.taken = taken  # type: ignore[attr-defined]
    return Provider


@pytest.fixture
def run_with(tmp_path: Path) -> Iterator[Callable[..., FakeRun]]:
    made: list[FakeRun] = []

    def make(moment: str, slot: str, *overrides: str) -> FakeRun:
        run = FakeRun(tmp_path, list(overrides), {}, provider_cls=taken_at(moment, slot))
        made.append(run)
        return run

    yield make
    for run in made:
        run.fleet.release()


def kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


@pytest.mark.parametrize("moment", ["setup", "start"])
def test_a_worker_lost_before_training_is_replaced_under_replace(run_with, moment: str) -> None:
    run = run_with(moment, "worker-1", "cluster.recovery.on_revocation=replace")
    events = run.follow()
    [lost] = run.provider.taken  # type: ignore[attr-defined]
    assert [e["host"] for e in kinds(events, "revocation")] == ["worker-1"]
    [ready] = kinds(events, "replacement_ready")
    assert ready["host"] == "worker-1" and ready["host_id"] != lost.id
    assert [e["action"] for e in kinds(events, "recovery_end")] == ["replace"]
    [started] = kinds(events, "train_start")  # training started once, with both workers
    assert started["workers"] == 2
    assert run.fleet.cluster.hosts_for(Role.WORKER)[1].id == ready["host_id"]
    assert kinds(events, "train_end") and not kinds(events, "failure")


@pytest.mark.parametrize("moment", ["setup", "start"])
def test_a_worker_lost_before_training_shrinks_the_cluster_under_shrink(
        run_with, moment: str) -> None:
    run = run_with(moment, "worker-0", "cluster.recovery.on_revocation=shrink")
    events = run.follow()
    [lost] = run.provider.taken  # type: ignore[attr-defined]
    assert [e["host"] for e in kinds(events, "revocation")] == ["worker-0"]
    assert [e["action"] for e in kinds(events, "recovery_end")] == ["continue"]
    assert not kinds(events, "replacement_ready")
    [started] = kinds(events, "train_start")
    assert started["workers"] == 1  # the spec no longer names the lost worker
    assert [h.id for h in run.fleet.dropped] == [lost.id]
    assert kinds(events, "train_end") and not kinds(events, "failure")


def test_the_only_worker_lost_before_training_under_shrink_fails_the_run_with_the_reason(
        run_with) -> None:
    run = run_with("setup", "worker-0", "cluster.workers=1",
                   "cluster.recovery.on_revocation=shrink")
    events = run.follow()
    assert "every worker was lost" in (run.supervisor.state.error or "")
    assert kinds(events, "recovery_failed") and not kinds(events, "train_start")


@pytest.mark.parametrize("moment", ["setup", "start"])
def test_the_ps_lost_before_training_gets_a_new_machine(run_with, moment: str) -> None:
    run = run_with(moment, "ps-0", "cluster.recovery.on_revocation=shrink")
    events = run.follow()
    [lost] = run.provider.taken  # type: ignore[attr-defined]
    [start] = kinds(events, "recovery_start")
    assert (start["action"], start["attempt"], start["resume_step"]) == ("restart", 1, 0)
    ready = {e["host"]: e["host_id"] for e in kinds(events, "replacement_ready")}
    assert "ps-0" in ready and ready["ps-0"] != lost.id
    assert run.fleet.cluster.hosts_for(Role.PS)[0].id == ready["ps-0"]
    assert len(kinds(events, "train_start")) == 1
    assert kinds(events, "train_end") and not kinds(events, "failure")


def test_a_ps_lost_before_training_more_often_than_max_restarts_fails_the_run(
        run_with) -> None:
    run = run_with("setup", "ps-0", "cluster.recovery.max_restarts=0")
    events = run.follow()
    assert "max_restarts=0 is exhausted" in (run.supervisor.state.error or "")
    assert kinds(events, "recovery_failed") and not kinds(events, "train_start")
