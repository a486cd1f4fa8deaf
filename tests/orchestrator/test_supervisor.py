"""The supervisor, the fleet and recovery with real processes but no TensorFlow: the roles are
tests/orchestrator/fake_role.py (the trainer's protocols, in milliseconds) on the local
backend, started by the real deployer and followed by the real supervisor."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.plan import make_plan
from orchestrator.rundir import results
from orchestrator.runtime.control import ControlChannel
from orchestrator.runtime.fleet import Fleet
from orchestrator.runtime.progress import RunProgress
from orchestrator.runtime.run import build_trainer_spec, cluster_request
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.transient.revocation import RevocationSchedule
from orchestrator.validate import compose_experiment
from provisioning.base import Cluster, HostId, HostState, LocalFolderStore, Role
from provisioning.journal import JOURNAL_FILE, Journal, list_unreleased
from provisioning.local import LocalHostRunner, LocalProvider, LocalProviderConfig
from trainer.layout import CHECKPOINT_DIR, CONTROL_FILE

FAKE_ROLE = Path(__file__).with_name("fake_role.py")
RUN_LIMIT_S = 60.0  # a run of fake roles takes seconds; this only stops a hang


class CutLinkProvider(LocalProvider):
    """The local backend plus a cut network link: `cut(host)` makes poll report the host's
    machine REVOKED while its processes run on (as when a cloud VM vanishes from the network),
    so only polling can notice the loss."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cut_ids: set[HostId] = set()

    def cut(self, host_id: HostId) -> None:
        self.cut_ids.add(host_id)

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        states = super().poll(cluster)
        return {i: HostState.REVOKED if i in self.cut_ids else s for i, s in states.items()}


class NothingSharedRunner(LocalHostRunner):
    """A local host whose paths the orchestrator treats as remote: every file goes through
    copy and fetch, as on an SSH or GCE host."""

    shares_orchestrator_fs = False


class NothingSharedProvider(LocalProvider):
    """The local backend with hosts that share no filesystem with the orchestrator."""

    runner_class = NothingSharedRunner


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / results.EVENTS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FakeRun:
    """One run of fake roles: compose, plan, provision, deploy and follow, as run.py does."""

    def __init__(self, tmp_path: Path, overrides: list[str], knobs: dict[str, Any],
                 provider_cls: type[LocalProvider] = LocalProvider,
                 restart_timeout_s: float | None = 20.0) -> None:
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir()
        self.cfg = compose_experiment("digits_local", [
            "job.train_steps=40", "job.checkpoint_frequency=10", "cluster.workers=2",
            "cluster.recovery.replacement_delay_s=0.2", "cluster.recovery.restart_delay_s=0",
            "progress=false", *overrides])
        behaviour = tmp_path / "behaviour.json"
        behaviour.write_text(json.dumps({"step_s": 0.05, **knobs}))
        self.plan = make_plan(self.cfg)
        self.rec = results.RunRecorder(self.run_dir)
        self.provider = provider_cls(LocalProviderConfig(stop_grace_s=0.3),
                                     journal=Journal(self.run_dir / JOURNAL_FILE))
        cluster = self.provider.acquire(cluster_request(self.plan, "fake", self.run_dir))
        control = ControlChannel(self.run_dir / CONTROL_FILE)
        control.reset()
        self.fleet = Fleet(self.provider, cluster, self.run_dir,
                           build_trainer_spec(self.cfg, self.plan, cluster, "fake"),
                           LocalFolderStore(self.run_dir / CHECKPOINT_DIR), control, rec=self.rec,
                           ready_timeout_s=10.0, stop_grace_s=0.3,
                           command=[sys.executable, str(FAKE_ROLE)],
                           env={"FAKE_ROLE_BEHAVIOUR": str(behaviour)})
        self.supervisor = Supervisor(
            self.cfg, self.fleet, self.rec, RunProgress("fake", self.plan.total_steps, False),
            control, RevocationSchedule.from_config(self.cfg.revocation, self.plan.hosts),
            restart_timeout_s=restart_timeout_s, poll_interval_s=0.3)

    def follow(self, fault: Callable[[FakeRun], None] | None = None) -> list[dict[str, Any]]:
        """Deploy and follow to the end (a `fault` runs beside it in a thread); release; the
        recorded events."""
        errors: list[BaseException] = []
        if fault is not None:
            def guarded() -> None:
                try:
                    fault(self)
                except BaseException as error:  # reported by the test below
                    errors.append(error)
            threading.Thread(target=guarded, daemon=True).start()
        started = time.monotonic()
        try:
            self.supervisor.deploy()
            self.supervisor.follow()
        finally:
            self.fleet.release()
            self.rec.close()
        assert time.monotonic() - started < RUN_LIMIT_S
        assert not errors, errors
        assert list_unreleased(self.run_dir / JOURNAL_FILE) == [], "a process was left running"
        return read_events(self.run_dir)

    def restarted_task(self, role: Role) -> Any:
        """The role's task in the second deployment (the restart), once it was started."""
        deadline = time.monotonic() + RUN_LIMIT_S
        while True:
            deployments = list(self.fleet.deployments)
            if len(deployments) >= 2 and (role, 0) in deployments[1].tasks:
                return deployments[1].tasks[(role, 0)]
            assert time.monotonic() < deadline, f"timed out waiting for the restarted {role}"
            time.sleep(0.01)

    def wait_for(self, check: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        deadline = time.monotonic() + RUN_LIMIT_S
        while not check(read_events(self.run_dir)):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)


@pytest.fixture
def fake_run(tmp_path: Path) -> Iterator[Callable[..., FakeRun]]:
    made: list[FakeRun] = []

    def make(*overrides: str, knobs: dict[str, Any] | None = None, **kw: Any) -> FakeRun:
        run = FakeRun(tmp_path, list(overrides), knobs or {}, **kw)
        made.append(run)
        return run

    yield make
    for run in made:  # whatever a failing test left
        run.fleet.release()


def restarts_closed(events: list[dict[str, Any]]) -> None:
    """Every recovery_start ends in recovery_end, recovery_attempt_failed or recovery_failed."""
    ends = ("recovery_end", "recovery_attempt_failed", "recovery_failed")
    opened = 0
    for e in events:
        if e["kind"] == "recovery_start" and e.get("action") == "restart":
            assert opened == 0, "a restart started while another was open"
            opened = 1
        elif e["kind"] in ends and e.get("policy") == "restart_from_checkpoint":
            opened = 0
    assert opened == 0, "a recovery_start was never closed"


def ps_revoked_at_step(step: int, *more: str) -> list[str]:
    return ["cluster.ps_transient=true", "revocation=schedule",
            f"revocation.events=[{{target: ps-0, at_step: {step}}}]", *more]


def test_a_run_completes_with_receipt_times_and_the_role_clock(fake_run):
    run = fake_run()
    events = run.follow()
    state = run.supervisor.run_state
    assert run.supervisor.state.error is None
    assert state.global_step == 40 and state.final_accuracy == 0.9
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 40 and all("role_time" in e for e in steps)
    assert all(e["time"] >= e["role_time"] - 1.0 for e in steps)  # receipt, not before sending
    assert (run.run_dir / "checkpoints" / "DONE").exists()  # the chief wrote into the store


def test_ps_loss_restarts_from_the_checkpoint_store(fake_run):
    run = fake_run(*ps_revoked_at_step(15), "cluster.recovery.max_restarts=2")
    events = run.follow()
    kinds = Counter(e["kind"] for e in events)
    assert run.supervisor.state.error is None
    # chief_on_ps: the PS's machine took the chief and the evaluator with it, one restart
    assert sorted(e["role"] for e in events if e["kind"] == "revocation") == [
        "chief", "evaluator", "ps"]
    assert kinds["recovery_start"] == kinds["recovery_end"] == 1
    resumed = [e for e in events if e["kind"] == "train_start" and e.get("resumed_from")]
    assert [e["resumed_from"] for e in resumed] == ["ckpt-10"]  # a new chief host resumed
    restarts_closed(events)


def test_a_restarted_chief_killed_before_training_resumed_is_another_attempt(fake_run):
    run = fake_run(*ps_revoked_at_step(15), "cluster.recovery.max_restarts=3",
                   knobs={"resume_delay_s": 1.5})

    def kill_restarted_chief(run: FakeRun) -> None:
        run.restarted_task(Role.CHIEF).process.kill()

    events = run.follow(kill_restarted_chief)
    assert run.supervisor.state.error is None
    failed = [e for e in events if e["kind"] == "recovery_attempt_failed"]
    assert [e["attempt"] for e in failed] == [1] and "chief 0 exited" in failed[0]["reason"]
    starts = [e["attempt"] for e in events if e["kind"] == "recovery_start"]
    assert starts == [1, 2]
    assert [e["kind"] for e in events].count("recovery_end") == 1
    restarts_closed(events)


def test_a_ps_killed_again_before_it_is_ready_is_another_attempt(fake_run):
    run = fake_run(*ps_revoked_at_step(15), "cluster.recovery.max_restarts=3",
                   knobs={"ps_ready_delay_s": 1.5})

    def kill_restarted_ps(run: FakeRun) -> None:
        task = run.restarted_task(Role.PS)
        time.sleep(0.3)
        assert not task.ready.is_set()
        task.process.kill()

    events = run.follow(kill_restarted_ps)
    assert run.supervisor.state.error is None, run.supervisor.state.error
    failed = [e for e in events if e["kind"] == "recovery_attempt_failed"]
    assert len(failed) == 1 and "restart failed" in failed[0]["reason"]
    assert [e["attempt"] for e in events if e["kind"] == "recovery_start"] == [1, 2]
    restarts_closed(events)


def test_a_restart_that_never_resumes_fails_at_its_deadline_not_never(fake_run):
    run = fake_run(*ps_revoked_at_step(15), "cluster.recovery.max_restarts=1",
                   knobs={"hang_chief_start": 2}, restart_timeout_s=2.0)
    events = run.follow()
    error = run.supervisor.state.error
    assert error is not None and "max_restarts=1 is exhausted" in error
    failed = [e for e in events if e["kind"] == "recovery_attempt_failed"]
    assert len(failed) == 1 and "did not resume within 2 s" in failed[0]["reason"]
    assert [e["kind"] for e in events].count("recovery_failed") == 1
    restarts_closed(events)


def test_a_host_lost_without_a_process_exit_is_found_by_polling(fake_run):
    run = fake_run("cluster.recovery.on_revocation=replace", provider_cls=CutLinkProvider,
                   knobs={"step_s": 0.1})

    def cut_worker_link(run: FakeRun) -> None:
        run.wait_for(lambda es: any(e["kind"] == "step" and e["step"] >= 5 for e in es),
                     "training")
        assert isinstance(run.provider, CutLinkProvider)
        run.provider.cut(run.fleet.cluster.hosts_for(Role.WORKER)[1].id)

    events = run.follow(cut_worker_link)
    assert run.supervisor.state.error is None
    lost = [e for e in events if e["kind"] in ("revocation", "server_failure")]
    assert [(e["kind"], e["host"], e["cause"]) for e in lost] == [
        ("revocation", "worker-1", "revoked")]  # the cause the provider reported, once
    assert [e["host"] for e in events if e["kind"] == "replacement_ready"] == ["worker-1"]


def test_a_revoked_worker_is_one_loss_though_both_its_exit_and_the_poll_report_it(fake_run):
    run = fake_run("cluster.recovery.on_revocation=replace", "revocation=schedule",
                   "revocation.events=[{target: worker-0, at_step: 8}]")
    events = run.follow()
    assert run.supervisor.state.error is None
    assert [e["host"] for e in events if e["kind"] == "revocation"] == ["worker-0"]
    assert Counter(e["kind"] for e in events)["replacement_ready"] == 1


def test_a_restart_on_other_hosts_resumes_from_the_synced_store_when_nothing_is_shared(
        fake_run):
    """Checkpoints written on the chief's host reach the orchestrator's store; a restart on a
    fresh machine (a new work dir) gets them copied over and resumes from the latest."""
    run = fake_run(*ps_revoked_at_step(25), "cluster.recovery.max_restarts=1",
                   provider_cls=NothingSharedProvider)
    events = run.follow()
    assert run.supervisor.state.error is None, run.supervisor.state.error
    store = run.run_dir / "checkpoints"
    assert {"ckpt-10", "ckpt-20", "ckpt-40", "DONE"} <= {p.name for p in store.iterdir()}
    resumed = [e["resumed_from"] for e in events
               if e["kind"] == "train_start" and e.get("resumed_from")]
    assert resumed == ["ckpt-20"]
    chiefs = [h for h in (run.run_dir / "hosts").iterdir() if (h / "checkpoints").exists()]
    assert len(chiefs) == 2  # the first chief's machine and the restart's, each its own copy


class SlowReplaceProvider(LocalProvider):
    """The local backend whose replacement hosts take REPLACE_S to come up, as a cloud VM
    takes minutes to create, boot and set up."""

    REPLACE_S = 3.0

    def __init__(self, config: LocalProviderConfig, **kwargs: Any) -> None:
        super().__init__(config, provision_delay_s=self.REPLACE_S, **kwargs)


def test_a_replacement_is_provisioned_off_the_loop_which_keeps_following_the_run(fake_run):
    """While the replacement host comes up, the supervisor goes on handling the survivors'
    steps and checkpoints (written to events.jsonl before `replacement_ready`), then starts
    the role on the new host."""
    run = fake_run("cluster.recovery.on_revocation=replace", "revocation=schedule",
                   "revocation.events=[{target: worker-0, at_step: 4}]",
                   provider_cls=SlowReplaceProvider, knobs={"step_s": 0.2})  # 7 s on 1 worker
    events = run.follow()
    assert run.supervisor.state.error is None, run.supervisor.state.error
    kinds = [e["kind"] for e in events]
    began = next(e["time"] for e in events
                 if e["kind"] == "recovery_start" and e.get("action") == "replace")
    ready = kinds.index("replacement_ready")
    # handled while provisioning: received well after the replacement began (the decision's
    # replacement_delay_s is 0.2 s), recorded before it was ready
    during = [e for e in events[:ready] if e["kind"] in ("step", "checkpoint")
              and e["time"] > began + 1.0]
    assert during, "the loop handled nothing while the replacement was provisioned"
    assert [e["host"] for e in events if e["kind"] == "replacement_ready"] == ["worker-0"]
    assert run.fleet.cluster.hosts_for(Role.WORKER)[0].id in {  # its role ran on the new host
        t.host.id for t in run.fleet.deployment.tasks.values()}


def test_a_finished_background_replacement_wakes_the_loop_with_its_hosts_ready(fake_run):
    """The supervisor waits for trainer events; the background replacement ends that wait
    when it is done (the loop then starts the new host's role at once, not a tick later),
    and its hosts are ready to hand over by then. With no role left to send an event, only
    the wake-up can end this wait (a hang would be stopped by pytest's timeout)."""
    run = fake_run()
    run.fleet.deploy()
    run.fleet.stop_roles()
    deployment = run.fleet.deployment
    list(deployment.events(0.5))  # drain what the stopped roles sent
    lost = run.fleet.cluster.hosts_for(Role.WORKER)[1]
    run.fleet.begin_replace([lost.id])
    assert deployment.next_event(timeout_s=None) is None  # woken, not an event
    new_hosts = run.fleet.finish_replace()
    assert new_hosts is not None and [h.spec.name for h in new_hosts] == [lost.spec.name]
    assert lost.id not in {h.id for h in run.fleet.cluster.hosts}


def test_a_killed_evaluator_is_started_again_and_counted_in_the_summary(fake_run):
    """The evaluator's process killed mid-run: started again on its host, and the summary
    counts it among the roles restarted, as it would a PS or a worker."""
    from orchestrator.rundir.record import summarize

    run = fake_run(knobs={"step_s": 0.1})

    def kill_evaluator(run: FakeRun) -> None:
        run.wait_for(lambda es: any(e["kind"] == "step" and e["step"] >= 5 for e in es),
                     "training")
        run.fleet.deployment.tasks[(Role.EVALUATOR, 0)].process.kill()

    events = run.follow(kill_evaluator)
    assert run.supervisor.state.error is None, run.supervisor.state.error
    assert [e["role"] for e in events if e["kind"] == "server_failure"] == ["evaluator"]
    summary = summarize(run.supervisor.run_state, run.plan.to_dict(), run_id="r",
                        status=results.STATUS_COMPLETED, wall_s=1.0, cost_usd=0.0, error=None)
    assert summary.roles_restarted == {"evaluator": 1} and summary.restarts == 0
    # the fake evaluator evaluates only the final checkpoint: the others are named
    assert [s["step"] for s in summary.eval_skipped or []] == [10, 20, 30]
