"""Recovery policies on real records and the real local provider: policies decide, the caller
acts on the provider and hands the outcome back to the planner to be recorded."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from orchestrator.config.transient import OnRevocation, RecoveryConfig
from orchestrator.rundir.record import fold
from orchestrator.transient.recovery import (
    EVENT_RECOVERY_ATTEMPT_FAILED,
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
    Cluster,
    ClusterRequest,
    HostSpec,
    HostState,
    Role,
)
from provisioning.local import LocalProvider

DELAY_S = 70.0


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


def tally(*events: RecordedEvent) -> dict[str, int]:
    """The summary's recovery counts of these events, as the run record folds them."""
    state = fold({"kind": e.kind, "role": "orchestrator", **e.fields} for e in events)
    return {"revocations": state.revocations, "replacements": state.replacements,
            "recoveries": state.recoveries, "restarts": state.restarts,
            "lost_steps": state.lost_steps}


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
        assert tally(*d.events) == {"revocations": 1, "replacements": 0, "recoveries": 1,
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
        new_cluster = provider.replace(cluster, d.replace_host_ids)
        [new] = [h for h in new_cluster.hosts if h.id not in {c.id for c in cluster.hosts}]
        assert new.spec.name == "worker-1" and new.id != lost.host_id
        assert new_cluster.index_of(new) == 1  # same task index as the lost worker
        assert provider.poll(new_cluster)[new.id] == HostState.RUNNING
        assert provider.poll(cluster)[lost.host_id].is_terminal()
        events = p.replaced(d, [new], 171.0)
        assert kinds(events) == [EVENT_REPLACEMENT_READY]
        assert events[0].fields["wait_s"] == 71.0
        end = p.end(d, 175.0)
        assert (end.kind, end.fields["duration_s"], end.fields["lost_steps"]) == (
            EVENT_RECOVERY_END, 75.0, 0)
        assert tally(*d.events, *events, end) == {"revocations": 1, "replacements": 1,
                                                  "recoveries": 1, "restarts": 0,
                                                  "lost_steps": 0}

    def test_no_capacity_degrades_to_shrink(self, cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.replace)
        [d] = p.decide([loss_of(cluster, "worker-0")], TrainingProgress(5, None, 1), 1.0)
        events = p.replacement_failed(d, "CapacityError: no K80 left in us-west1-b")
        assert kinds(events) == [EVENT_REPLACEMENT_FAILED]
        assert events[0].fields["hosts"] == ["worker-0"]
        end = p.end(d, 71.0, ok=False)
        assert end.fields["action"] == Action.proceed.value
        counts = tally(*d.events, *events, end)
        assert counts["recoveries"] == 1 and counts["replacements"] == 0


class TestRestartFromCheckpoint:
    def test_lost_steps_are_the_steps_since_the_checkpoint(self, cluster: Cluster) -> None:
        p = planner(restart_delay_s=3.0)
        [d] = p.decide([loss_of(cluster, "ps-0")], TrainingProgress(1240, 1000, 3), 50.0)
        assert (d.action, d.lost_steps, d.resume_step, d.attempt) == (Action.restart, 240,
                                                                       1000, 1)
        assert d.execute_at_s == 50.0 + DELAY_S + 3.0
        assert kinds(d.events) == [EVENT_REVOCATION, EVENT_RECOVERY_START,
                                   EVENT_REPLACEMENT_REQUESTED]
        counts = tally(*d.events)
        assert counts["lost_steps"] == 240 and counts["restarts"] == 1

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

    def test_a_failed_attempt_is_closed_and_retried_until_max_restarts(self, cluster: Cluster
                                                                       ) -> None:
        p = planner(max_restarts=2)
        [d1] = p.decide([loss_of(cluster, "ps-0", at_s=10.0)], TrainingProgress(100, 50, 3),
                        10.0)
        closed = p.attempt_failed(d1, "chief 0 exited with code -9 before training resumed",
                                  25.0)
        assert (closed.kind, closed.fields["attempt"], closed.fields["duration_s"]) == (
            EVENT_RECOVERY_ATTEMPT_FAILED, 1, 15.0)
        # a worker lost during the attempt still needs a restart: the cluster is not training
        d2 = p.retry_restart([loss_of(cluster, "worker-0", at_s=25.0)],
                             TrainingProgress(100, 50, 2), 25.0)
        assert (d2.action, d2.attempt) == (Action.restart, 2)
        d3 = p.retry_restart([loss_of(cluster, "ps-0", at_s=40.0)],
                             TrainingProgress(100, 50, 2), 40.0)
        assert d3.action == Action.fail and kinds(d3.events)[-1] == EVENT_RECOVERY_FAILED
        assert tally(*d1.events, closed, *d2.events, *d3.events)["restarts"] == 2


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

    def test_the_record_counts_the_events_the_planner_hands_out(self, provider: LocalProvider,
                                                                cluster: Cluster) -> None:
        p = planner(on_revocation=OnRevocation.replace)
        recorded: list[RecordedEvent] = []
        [d1] = p.decide([loss_of(cluster, "worker-0")], TrainingProgress(100, 50, 2), 1.0)
        recorded += d1.events
        new_cluster = provider.replace(cluster, d1.replace_host_ids)
        new = [h for h in new_cluster.hosts if h.id not in {c.id for c in cluster.hosts}]
        recorded += [*p.replaced(d1, new, 71.0), p.end(d1, 72.0)]
        [d2] = p.decide([loss_of(new_cluster, "ps-0")], TrainingProgress(180, 150, 3), 80.0)
        recorded += d2.events
        summary = tally(*recorded)
        assert summary["revocations"] == kinds(recorded).count(EVENT_REVOCATION) == 2
        assert summary["replacements"] == kinds(recorded).count(EVENT_REPLACEMENT_READY) == 1
        assert summary["recoveries"] == kinds(recorded).count(EVENT_RECOVERY_END) == 1
        assert summary["lost_steps"] == sum(e.fields.get("lost_steps", 0) for e in recorded
                                            if e.kind == EVENT_RECOVERY_START) == 30
