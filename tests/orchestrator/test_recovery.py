"""Recovery policies on real records and the real local provider (a fake only for no capacity)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from orchestrator.config.transient import OnRevocation, RecoveryConfig
from orchestrator.transient.recovery import (
    EVENT_RECOVERY_END,
    EVENT_RECOVERY_FAILED,
    EVENT_RECOVERY_START,
    EVENT_REPLACEMENT_FAILED,
    EVENT_REPLACEMENT_READY,
    EVENT_REPLACEMENT_REQUESTED,
    EVENT_REVOCATION,
    EVENT_SERVER_FAILURE,
    Action,
    HostLoss,
    LossCause,
    RecordedEvent,
    RecoveryPlanner,
    TrainingProgress,
    get_recovery_policy,
)
from provisioning.base import (
    CapacityError,
    Cluster,
    ClusterRequest,
    Host,
    HostId,
    HostRunner,
    HostSpec,
    HostState,
    Provider,
    Role,
)
from provisioning.local import LocalProvider

DELAY_S = 70.0


class NoCapacityProvider(Provider):
    """Acquires like the local provider but never has capacity for a replacement."""

    name = "no-capacity"

    def __init__(self) -> None:
        self._local = LocalProvider()

    def acquire(self, request: ClusterRequest) -> Cluster:
        return self._local.acquire(request)

    def runner(self, host: Host) -> HostRunner:
        return self._local.runner(host)

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        return self._local.poll(cluster)

    def replace(self, cluster: Cluster, lost: Sequence[HostId]) -> Cluster:
        raise CapacityError("no K80 left in us-west1-b")

    def release(self, cluster: Cluster) -> None:
        self._local.release(cluster)


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    yield LocalProvider()


@pytest.fixture
def cluster(provider: LocalProvider, tmp_path: Path) -> Iterator[Cluster]:
    hosts = [HostSpec("ps-0", Role.PS), HostSpec("chief-0", Role.CHIEF),
             HostSpec("evaluator-0", Role.EVALUATOR)]
    hosts += [HostSpec(f"worker-{i}", Role.WORKER, transient=True) for i in range(3)]
    c = provider.acquire(ClusterRequest("run1", hosts, tmp_path))
    yield c
    provider.release(c)


def loss_of(cluster: Cluster, name: str, at_s: float = 100.0, **kw: object) -> HostLoss:
    host = next(h for h in cluster.hosts if h.spec.name == name)
    return HostLoss(host.id, name, host.role, at_s, **kw)


def kinds(events: Sequence[RecordedEvent]) -> list[str]:
    return [e.kind for e in events]


def planner(**kw: object) -> RecoveryPlanner:
    return RecoveryPlanner(RecoveryConfig(replacement_delay_s=DELAY_S, **kw))


class TestShrinkOnWorkerLoss:
    def test_training_continues_without_lost_steps(self, cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.shrink)
        [d] = p.decide([loss_of(cluster, "worker-1")], TrainingProgress(500, 400, 2), 100.0)
        assert (d.action, d.policy, d.lost_steps, d.execute_at_s) == (Action.proceed, "shrink",
                                                                       0, 100.0)
        assert kinds(d.events) == [EVENT_REVOCATION, EVENT_RECOVERY_START, EVENT_RECOVERY_END]
        assert d.events[0].fields == {"host": "worker-1", "host_id": d.losses[0].host_id,
                                      "role": "worker", "cause": "revoked"}
        assert p.tally.to_summary() == {"revocations": 1, "replacements": 0, "recoveries": 1,
                                        "restarts": 0, "lost_steps": 0}

    def test_losing_the_last_worker_fails_the_run_with_the_fix(self, cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.shrink)
        [d] = p.decide([loss_of(cluster, "worker-0")], TrainingProgress(10, None, 0), 5.0)
        assert d.action == Action.fail
        assert "on_revocation=replace" in d.reason
        assert kinds(d.events) == [EVENT_REVOCATION, EVENT_RECOVERY_FAILED]


class TestReplaceOnWorkerLoss:
    def test_replacement_is_requested_after_the_delay(self, cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.replace)
        loss = loss_of(cluster, "worker-2")
        [d] = p.decide([loss], TrainingProgress(500, 400, 2), 100.0)
        assert (d.action, d.execute_at_s, d.replace_host_ids) == (Action.replace, 170.0,
                                                                   (loss.host_id,))
        assert kinds(d.events) == [EVENT_REVOCATION, EVENT_RECOVERY_START,
                                   EVENT_REPLACEMENT_REQUESTED]
        assert d.events[-1].fields["ready_at_s"] == 170.0

    def test_replacement_takes_the_lost_slot(self, provider: LocalProvider,
                                             cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.replace)
        lost = loss_of(cluster, "worker-1")
        [d] = p.decide([lost], TrainingProgress(500, 400, 2), 100.0)
        result = p.complete(d, provider, cluster, 171.0)
        [new] = result.new_hosts
        assert result.ok and new.spec.name == "worker-1" and new.id != lost.host_id
        assert result.cluster.index_of(new) == 1  # same task index as the lost worker
        assert provider.poll(result.cluster)[new.id] == HostState.RUNNING
        assert provider.poll(cluster)[lost.host_id].is_terminal()
        assert kinds(result.events) == [EVENT_REPLACEMENT_READY]
        assert result.events[0].fields["wait_s"] == 71.0
        end = p.end(d, 175.0)
        assert (end.kind, end.fields["duration_s"], end.fields["lost_steps"]) == (
            EVENT_RECOVERY_END, 75.0, 0)
        assert p.tally.to_summary() == {"revocations": 1, "replacements": 1, "recoveries": 1,
                                        "restarts": 0, "lost_steps": 0}

    def test_no_capacity_degrades_to_shrink(self, tmp_path: Path) -> None:
        fake = NoCapacityProvider()
        c = fake.acquire(ClusterRequest("run2", [HostSpec("worker-0", Role.WORKER, transient=True),
                                                 HostSpec("worker-1", Role.WORKER,
                                                          transient=True)], tmp_path))
        try:
            p = planner(on_revocation=OnRevocation.replace)
            [d] = p.decide([loss_of(c, "worker-0")], TrainingProgress(5, None, 1), 1.0)
            result = p.complete(d, fake, c, 71.0)
            assert not result.ok and result.cluster is c and result.new_hosts == ()
            assert kinds(result.events) == [EVENT_REPLACEMENT_FAILED]
            assert p.end(d, 71.0, ok=False).fields["action"] == Action.proceed.value
        finally:
            fake.release(c)


class TestRestartFromCheckpoint:
    def test_lost_steps_are_the_steps_since_the_checkpoint(self, cluster: Cluster) -> None:
        p = planner(restart_delay_s=3.0)
        [d] = p.decide([loss_of(cluster, "ps-0")], TrainingProgress(1240, 1000, 3), 50.0)
        assert (d.action, d.lost_steps, d.resume_step, d.attempt) == (Action.restart, 240,
                                                                       1000, 1)
        assert d.execute_at_s == 50.0 + DELAY_S + 3.0
        assert kinds(d.events) == [EVENT_REVOCATION, EVENT_RECOVERY_START,
                                   EVENT_REPLACEMENT_REQUESTED]
        assert p.tally.lost_steps == 240 and p.tally.restarts == 1

    def test_without_a_checkpoint_every_step_is_lost(self, cluster: Cluster) -> None:
        [d] = planner().decide([loss_of(cluster, "chief-0")], TrainingProgress(77, None, 3), 1.0)
        assert (d.lost_steps, d.resume_step) == (77, 0)

    def test_a_crashed_process_on_a_live_host_is_restarted_in_place(self, cluster: Cluster
                                                                     ) -> None:
        loss = loss_of(cluster, "ps-0", cause=LossCause.crashed, host_gone=False)
        [d] = planner(restart_delay_s=2.0).decide([loss], TrainingProgress(9, 5, 3), 10.0)
        assert (d.replace_host_ids, d.execute_at_s) == ((), 12.0)
        assert kinds(d.events) == [EVENT_SERVER_FAILURE, EVENT_RECOVERY_START]

    def test_retries_are_bounded(self, cluster: Cluster) -> None:
        p = planner(max_restarts=2)
        decisions = [p.decide([loss_of(cluster, "ps-0", at_s=t)], TrainingProgress(100, 50, 3),
                              t)[0] for t in (1.0, 2.0, 3.0)]
        assert [d.action for d in decisions] == [Action.restart, Action.restart, Action.fail]
        assert [d.attempt for d in decisions[:2]] == [1, 2]
        assert decisions[2].reason == ("lost ps-0 after 2 restart(s) from checkpoint; "
                                       "cluster.recovery.max_restarts=2 is exhausted")
        assert kinds(decisions[2].events) == [EVENT_REVOCATION, EVENT_RECOVERY_FAILED]

    def test_zero_restarts_fails_at_once(self, cluster: Cluster) -> None:
        [d] = planner(max_restarts=0).decide([loss_of(cluster, "ps-0")],
                                             TrainingProgress(1, None, 3), 1.0)
        assert d.action == Action.fail

    def test_restart_replaces_the_lost_ps_in_its_slot(self, provider: LocalProvider,
                                                      cluster: Cluster) -> None:
        p = planner()
        [d] = p.decide([loss_of(cluster, "ps-0")], TrainingProgress(10, 0, 3), 0.0)
        result = p.complete(d, provider, cluster, DELAY_S)
        assert [h.spec.name for h in result.new_hosts] == ["ps-0"]
        assert result.cluster.hosts_for(Role.PS) == list(result.new_hosts)


class TestRouting:
    def test_ps_and_worker_lost_together_make_one_restart(self, cluster: Cluster) -> None:
        losses = [loss_of(cluster, "worker-0"), loss_of(cluster, "ps-0")]
        [d] = planner(on_revocation=OnRevocation.shrink).decide(
            losses, TrainingProgress(30, 20, 2), 5.0)
        assert d.action == Action.restart and set(d.replace_host_ids) == {
            loss.host_id for loss in losses}

    def test_the_evaluator_is_replaced_even_when_workers_shrink(self, cluster: Cluster) -> None:
        losses = [loss_of(cluster, "worker-0"), loss_of(cluster, "evaluator-0")]
        decisions = planner(on_revocation=OnRevocation.shrink).decide(
            losses, TrainingProgress(30, 20, 2), 5.0)
        assert {(d.policy, d.action) for d in decisions} == {("shrink", Action.proceed),
                                                             ("replace", Action.replace)}

    def test_no_losses_no_decisions_and_unknown_policy_names_the_valid_ones(self) -> None:
        assert planner().decide([], TrainingProgress(0, None, 1), 0.0) == []
        with pytest.raises(ValueError, match=r"replace, restart_from_checkpoint, shrink"):
            get_recovery_policy("failover", RecoveryConfig())

    def test_tally_agrees_with_the_recorded_events(self, provider: LocalProvider,
                                                   cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.replace)
        recorded: list[RecordedEvent] = []
        [d1] = p.decide([loss_of(cluster, "worker-0")], TrainingProgress(100, 50, 2), 1.0)
        recorded += d1.events
        result = p.complete(d1, provider, cluster, 71.0)
        recorded += [*result.events, p.end(d1, 72.0)]
        [d2] = p.decide([loss_of(result.cluster, "ps-0")], TrainingProgress(180, 150, 3), 80.0)
        recorded += d2.events
        summary = p.tally.to_summary()
        assert summary["revocations"] == kinds(recorded).count(EVENT_REVOCATION) == 2
        assert summary["replacements"] == kinds(recorded).count(EVENT_REPLACEMENT_READY) == 1
        assert summary["recoveries"] == kinds(recorded).count(EVENT_RECOVERY_END) == 1
        assert summary["lost_steps"] == sum(e.fields.get("lost_steps", 0) for e in recorded
                                            if e.kind == EVENT_RECOVERY_START) == 30
