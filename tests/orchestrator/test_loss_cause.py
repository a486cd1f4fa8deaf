"""The cause of a lost host comes from the cloud (the provider's poll) or from the injected
revocation schedule, never from which signal reached the supervisor first. A cloud whose
listing lags (GCE answers from one listing per poll interval) lets a preempted VM's process
exit arrive while the provider still says RUNNING: that exit is held until the provider has
answered, so the preemption is recorded as a revocation, once, and counted in the summary.

The order of the two signals is forced, not timed: the provider below hides a host's
REVOKED state until the test, having seen the supervisor hold the exit, lets it answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioning.base import Cluster, HostId, HostState, Role
from provisioning.local import LocalProvider
from tests.orchestrator.test_supervisor import RUN_LIMIT_S, FakeRun

LOSSES = ("revocation", "server_failure")


class LaggingProvider(LocalProvider):
    """The local backend behind a cloud API that answers late: poll() goes on reporting
    RUNNING for a host in `unanswered` after the host was taken, until `answer(host)`.
    `lag_s` is what the backend declares (Provider.state_lag_s); here only a hang guard."""

    lag_s = RUN_LIMIT_S / 2
    hide_all = False  # every host's REVOKED stays hidden (a cloud that never answers in time)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unanswered: set[HostId] = set()

    def state_lag_s(self) -> float:
        return self.lag_s

    def answer(self, host_id: HostId) -> None:
        self.unanswered.discard(host_id)

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        states = super().poll(cluster)
        return {i: HostState.RUNNING if s == HostState.REVOKED and (
                    self.hide_all or i in self.unanswered) else s
                for i, s in states.items()}


class NeverAnswers(LaggingProvider):
    hide_all = True


class AnswersSoon(LaggingProvider):
    lag_s = 0.5


@pytest.fixture
def lagging_run(tmp_path: Path) -> Iterator[Callable[..., FakeRun]]:
    """A run of fake roles on `provider_cls` (test_supervisor's FakeRun), released at the end
    whatever the test did."""
    made: list[FakeRun] = []

    def make(*overrides: str, provider_cls: type[LaggingProvider]) -> FakeRun:
        made.append(FakeRun(tmp_path, list(overrides), {}, provider_cls=provider_cls))
        return made[-1]

    yield make
    for run in made:
        run.fleet.release()


def losses(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(e["kind"], e["host"], e["cause"]) for e in events if e["kind"] in LOSSES]


def _training(run: FakeRun) -> None:
    run.wait_for(lambda es: any(e["kind"] == "step" and e["step"] >= 5 for e in es), "training")


def test_a_preemption_whose_process_exit_arrives_first_is_a_revocation(lagging_run):
    run = lagging_run("cluster.recovery.on_revocation=replace", provider_cls=LaggingProvider)
    assert isinstance(run.provider, LaggingProvider)
    provider, supervisor = run.provider, run.supervisor
    held: list[bool] = []

    def preempt_with_a_late_listing(run: FakeRun) -> None:
        _training(run)
        host = run.fleet.cluster.hosts_for(Role.WORKER)[1]
        provider.unanswered.add(host.id)
        provider.revoke(host)  # the cloud takes it: processes killed, the listing not updated
        run.wait_for(lambda es: host.id in supervisor.held
                     or any(e["kind"] in LOSSES for e in es), "the exit to be seen")
        held.append(host.id in supervisor.held)
        provider.answer(host.id)  # only now does the provider report REVOKED

    events = run.follow(preempt_with_a_late_listing)
    assert held == [True], "the exit was decided before the provider answered"
    assert run.supervisor.state.error is None, run.supervisor.state.error
    assert losses(events) == [("revocation", "worker-1", "revoked")]
    assert run.supervisor.run_state.revocations == 1
    assert [e["host"] for e in events if e["kind"] == "replacement_ready"] == ["worker-1"]


def test_the_injected_schedule_is_the_cause_whatever_the_provider_says(lagging_run):
    """Our own revocation needs no word from the cloud: recorded at once as a revocation,
    though the provider's listing never says so while the run lasts."""
    run = lagging_run("cluster.recovery.on_revocation=replace", "revocation=schedule",
                   "revocation.events=[{target: worker-0, at_step: 8}]", provider_cls=NeverAnswers)
    events = run.follow()
    assert run.supervisor.state.error is None, run.supervisor.state.error
    assert losses(events) == [("revocation", "worker-0", "revoked")]
    assert run.supervisor.run_state.revocations == 1
    assert not run.supervisor.held


def test_a_crash_on_a_host_the_provider_still_runs_is_a_crash(lagging_run):
    """Held for the provider's word, which stays RUNNING: a crash, restarted in place, and no
    revocation counted."""
    run = lagging_run("cluster.recovery.on_revocation=replace", provider_cls=AnswersSoon)

    def crash_worker(run: FakeRun) -> None:
        _training(run)
        run.fleet.deployment.tasks[(Role.WORKER, 1)].process.kill()

    events = run.follow(crash_worker)
    assert run.supervisor.state.error is None, run.supervisor.state.error
    assert losses(events) == [("server_failure", "worker-1", "crashed")]
    assert run.supervisor.run_state.revocations == 0
