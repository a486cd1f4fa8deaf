"""The deployer against stand-in trainers (small scripts speaking Contract 2) on the local backend."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from orchestrator.runtime import deploy as deploy_module
from orchestrator.runtime.deploy import (
    EVENT_PROCESS_EXIT,
    DeployError,
    Deployment,
    TrainerEvent,
    parse_event_line,
)
from provisioning import ClusterRequest, HostSpec, Role
from provisioning.journal import list_group_members
from provisioning.local import LocalProvider

EVENT_WAIT_S = 10.0


def chief_exit_code(deployment: Deployment) -> int | None:
    """The chief's exit code; None while it runs or if no chief was started."""
    task = deployment.tasks.get((Role.CHIEF, 0))
    return None if task is None else task.process.poll()


def wait_for_completion(deployment: Deployment, timeout_s: float) -> bool:
    """Until the chief and every evaluator have exited (any code); False on timeout. Reads no
    event: the tests read them after."""
    deadline = time.monotonic() + timeout_s
    for task in [t for t in list(deployment.tasks.values())
                 if t.role in (Role.CHIEF, Role.EVALUATOR)]:
        try:
            task.process.wait(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
    return True

# Behaviours, chosen per "role" or "role-index" in the spec's "behavior" map:
#   serve: ready after a short delay, then block (like a PS);  listen: bind the port, never emit
#   ready;  stubborn: serve but ignore SIGTERM;  crash: exit 3 at once;  crash_later: ready,
#   then exit 5;  silent: never ready;  finish: ready, steps, train_end, exit 0 (chief/evaluator)
STAND_IN = """
import argparse, json, signal, socket, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--role"); parser.add_argument("--index", type=int); parser.add_argument("--spec")
args = parser.parse_args()
spec = json.load(open(args.spec))
behavior = spec["behavior"].get(f"{args.role}-{args.index}", spec["behavior"].get(args.role))
if behavior == "no_tf":  # the bare install: a traceback on stderr, nothing else
    print("Traceback (most recent call last):\\n  File ...\\n"
          "ModuleNotFoundError: No module named 'tensorflow'", file=sys.stderr)
    sys.exit(1)
def event(kind, **fields):
    line = {"kind": kind, "time": time.time(), "role": args.role, "index": args.index, **fields}
    print("@event " + json.dumps(line), flush=True)
print(f"log text from {args.role} {args.index}", flush=True)
print(f"stderr text from {args.role} {args.index}", file=sys.stderr, flush=True)
if behavior == "crash":
    sys.exit(3)
if behavior == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if behavior == "listen":
    host, port = spec["cluster"][args.role][args.index].split(":")
    server = socket.create_server((host, int(port)))
    time.sleep(60)
if behavior == "silent":
    time.sleep(60)
time.sleep(0.2)
event("ready", address=spec["cluster"].get(args.role, ["-"])[args.index])
if behavior == "crash_later":
    time.sleep(0.3)
    sys.exit(5)
if behavior == "finish":
    for step in (1, 2):
        event("step", step=step, loss=1.0 / step, steps_per_sec=10.0, lr=0.1)
    event("train_end", step=2, train_time_s=0.1)
    sys.exit(0)
time.sleep(60)
"""
SERVING = {"ps": "serve", "worker": "serve", "chief": "finish", "evaluator": "finish"}


@pytest.fixture
def deploy(tmp_path):
    """Factory: a Deployment of 1 ps, 2 workers, chief, evaluator running the stand-in."""
    provider = LocalProvider(stop_grace_s=0.3)
    made = []

    def make(behavior: dict[str, str], **options) -> Deployment:
        hosts = [HostSpec("ps0", Role.PS), HostSpec("w0", Role.WORKER)]
        hosts += [HostSpec("w1", Role.WORKER), HostSpec("chief", Role.CHIEF)]
        hosts += [HostSpec("eval", Role.EVALUATOR)]
        cluster = provider.acquire(ClusterRequest("run1", hosts, tmp_path))
        script = tmp_path / "stand_in.py"
        script.write_text(STAND_IN)
        spec = {"behavior": {**SERVING, **behavior}}
        spec["cluster"] = {r: cluster.endpoints(r) for r in ("ps", "worker", "chief")}
        options.setdefault("stop_grace_s", 0.3)
        deployment = Deployment(provider, cluster, tmp_path, json.dumps(spec),
                                command=[sys.executable, str(script)], **options)
        made.append(deployment)
        return deployment

    yield make
    for deployment in made:
        deployment.teardown()
        provider.release(deployment.cluster)


def collect_until(deployment: Deployment, done) -> list[TrainerEvent]:
    events: list[TrainerEvent] = []
    deadline = time.monotonic() + EVENT_WAIT_S
    while not done(events):
        assert time.monotonic() < deadline, f"timed out; got {events}"
        event = deployment.next_event(0.1)
        if event is not None:
            events.append(event)
    return events


def exits(events: list[TrainerEvent]) -> dict[tuple[str, int], TrainerEvent]:
    return {(e.role, e.index): e for e in events if e.kind == EVENT_PROCESS_EXIT}


def assert_no_process_left(deployment: Deployment) -> None:
    pgids = [task.process.pid for task in deployment.tasks.values()]
    assert [g for g in pgids if list_group_members(g)] == []


def test_parse_event_line():
    line = '@event {"kind": "step", "time": 5.0, "role": "chief", "index": 0, "step": 7}'
    assert parse_event_line(line) == TrainerEvent("step", 5.0, "chief", 0, {"step": 7})
    assert parse_event_line("plain log text") is None
    assert parse_event_line("@event {not json") is None
    assert parse_event_line('@event {"kind": "step"}') is None  # no role/index
    assert parse_event_line("@event [1, 2]") is None


def test_run_to_completion_events_logs_and_order(deploy, tmp_path):
    deployment = deploy({})
    deployment.start()
    assert wait_for_completion(deployment, EVENT_WAIT_S)
    # every role's ready line too: a server may be taken as ready by its port alone (another
    # test's process on a loaded machine can hold it), and print its line after the clients
    # (which do not wait for the servers) have exited
    events = collect_until(deployment, lambda es: len(exits(es)) == 2 and len(
        {(e.role, e.index) for e in es if e.kind == "ready"}) == 5)
    assert chief_exit_code(deployment) == 0
    ready = {(e.role, e.index): e.time for e in events if e.kind == "ready"}
    assert set(ready) == {("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0), ("evaluator", 0)}
    # start() returns only once every server is ready (the chief overlaps its start-up)
    assert all(deployment.tasks[(r, i)].ready.is_set()
               for r, i in ((Role.PS, 0), (Role.WORKER, 0), (Role.WORKER, 1)))
    steps = [e for e in events if e.kind == "step" and e.role == "chief"]
    assert [e.fields["step"] for e in steps] == [1, 2] and steps[0].fields["loss"] == 1.0
    assert ready_address(events, "ps") == deployment.cluster.endpoints("ps")[0]
    chief_exit = exits(events)[("chief", 0)]
    assert chief_exit.fields["exit_code"] == 0 and chief_exit.fields["expected"] is True
    log = (tmp_path / "logs" / "worker-1.log").read_text()
    assert "log text from worker 1" in log and "stderr text from worker 1" in log
    assert "@event" not in log
    deployment.teardown()
    deployment.teardown()  # idempotent
    assert_no_process_left(deployment)
    late = collect_until(deployment, lambda es: len(exits(es)) == 3)
    assert all(e.fields["expected"] for e in exits(late).values())


def ready_address(events: list[TrainerEvent], role: str) -> object:
    return next(e.fields["address"] for e in events if e.kind == "ready" and e.role == role)


def test_ready_by_port_without_event(deploy):
    deployment = deploy({"ps": "listen"})
    deployment.start()
    assert deployment.tasks[(Role.PS, 0)].ready.is_set()
    assert wait_for_completion(deployment, EVENT_WAIT_S)


def test_crash_before_ready_raises_naming_role_and_log(deploy, tmp_path):
    deployment = deploy({"worker-1": "crash"})
    with pytest.raises(DeployError, match=r"worker 1 exited with code 3 .*worker-1\.log"):
        deployment.start()
    deployment.teardown()  # the clients already started are stopped too
    assert_no_process_left(deployment)


def test_a_role_that_cannot_start_names_the_cause_from_its_log(deploy, tmp_path):
    """A remote role's cause is only in its log (issue 35): the error carries its last line,
    and says how to get TensorFlow when that is what is missing."""
    deployment = deploy({"ps": "no_tf"})
    with pytest.raises(DeployError) as info:
        deployment.start()
    assert str(info.value) == (
        "ps 0 exited with code 1 before it was ready: ModuleNotFoundError: No module named "
        "'tensorflow' (TensorFlow is not installed for that role's Python: pip install "
        f"'transient-orchestrator[cpu]', or [gpu] on a CUDA machine); see {tmp_path}/logs/ps-0.log")
    deployment.teardown()
    assert_no_process_left(deployment)


def test_not_ready_in_time_raises(deploy):
    deployment = deploy({"ps": "silent"}, ready_timeout_s=0.5)
    with pytest.raises(DeployError, match=r"ps 0 not ready after 0\.5 s"):
        deployment.start()


def test_unexpected_exit_becomes_an_event(deploy):
    deployment = deploy({"worker-0": "crash_later", "chief": "serve", "evaluator": "serve"})
    deployment.start()
    events = collect_until(deployment, lambda es: ("worker", 0) in exits(es))
    crash = exits(events)[("worker", 0)]
    assert crash.fields["exit_code"] == 5 and crash.fields["expected"] is False
    assert chief_exit_code(deployment) is None
    assert not wait_for_completion(deployment, 0.1)


def test_revoked_worker_is_reported_and_teardown_kills_stubborn_roles(deploy):
    behavior = {"ps": "stubborn", "worker": "stubborn", "chief": "serve", "evaluator": "serve"}
    deployment = deploy(behavior)
    deployment.start()
    worker = deployment.cluster.hosts_for(Role.WORKER)[1]
    deployment.provider.revoke(worker)
    events = collect_until(deployment, lambda es: ("worker", 1) in exits(es))
    revoked = exits(events)[("worker", 1)]
    assert revoked.fields["exit_code"] == -signal.SIGKILL and revoked.fields["expected"] is False
    assert revoked.fields["host_id"] == worker.id
    started = time.monotonic()
    deployment.teardown()
    assert time.monotonic() - started < 2.0  # one grace period per wave, not per host
    assert_no_process_left(deployment)


def test_replacement_host_takes_the_lost_index(deploy, tmp_path):
    deployment = deploy({"chief": "serve", "evaluator": "serve"})
    deployment.start()
    lost = deployment.cluster.hosts_for(Role.WORKER)[0]
    deployment.provider.revoke(lost)
    new_cluster = deployment.provider.replace(deployment.cluster, [lost.id])
    new_host = new_cluster.hosts_for(Role.WORKER)[0]
    task = deployment.start_role(new_host, new_cluster)
    deployment.wait_ready(task, timeout_s=EVENT_WAIT_S)
    assert (task.role, task.index) == (Role.WORKER, 0)
    assert deployment.tasks[(Role.WORKER, 0)].host.id == new_host.id
    assert Path(task.log_path).name == "worker-0.log"
    deployment.teardown()
    assert_no_process_left(deployment)


# A stand-in that holds its lease as every trainer role does (trainer/control.py), then serves.
LEASED = """
import json, sys, time
sys.path.insert(0, {repo!r})
from trainer.control import watch_lease
watch_lease(poll_s=0.1)
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
role, index = args["--role"], int(args["--index"])
line = {{"kind": "ready", "time": time.time(), "role": role, "index": index}}
print("@event " + json.dumps(line), flush=True)
time.sleep(60)
"""


def test_roles_hold_a_lease_that_ends_them_once_dropped_or_replaced(tmp_path, monkeypatch):
    """Each machine's lease is renewed while it is in the cluster: its roles outlive the
    term. A machine dropped from the cluster (replaced while frozen, say) is not renewed: its
    roles end by themselves after the term (exit 4, EXIT_LEASE_LOST) while the others run
    on. A new deployment on the same machines (a new generation) ends the old roles at once."""
    from provisioning import Cluster
    from trainer.layout import EXIT_LEASE_LOST, LEASE_FILE

    monkeypatch.setattr(deploy_module, "LEASE_RENEW_S", 0.2)
    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "leased.py"
    script.write_text(LEASED.format(repo=repo))
    provider = LocalProvider(stop_grace_s=0.3)
    hosts = [HostSpec("ps0", Role.PS), HostSpec("w0", Role.WORKER), HostSpec("w1", Role.WORKER)]
    cluster = provider.acquire(ClusterRequest("run1", hosts, tmp_path))
    first = Deployment(provider, cluster, tmp_path, "{}", command=[sys.executable, str(script)],
                       stop_grace_s=0.3)
    # a term of 15 renewals: a loaded machine (make test-fast's 2 processes beside other work)
    # delayed a renewal past a 1 s term once; the roles then ended while still in the cluster
    first.lease_s = 3.0
    second = None
    try:
        first.start()
        w1 = cluster.hosts_for(Role.WORKER)[1]
        assert (w1.workdir / LEASE_FILE).read_text() == first.lease_token
        time.sleep(6.5)  # over twice the term: renewed, so every role still runs
        assert all(t.process.poll() is None for t in first.tasks.values())
        # w1's machine leaves the cluster (as a frozen machine replaced by a spare does)
        first.cluster = Cluster(run_id=cluster.run_id,
                                hosts=[h for h in cluster.hosts if h.id != w1.id])
        ended = exits(collect_until(first, lambda ev: (Role.WORKER.value, 1) in exits(ev)))
        assert ended[(Role.WORKER.value, 1)].fields["exit_code"] == EXIT_LEASE_LOST
        assert all(t.process.poll() is None for (r, i), t in first.tasks.items()
                   if (r, i) != (Role.WORKER, 1))
        # a new deployment on the same machines: the old generation's roles end at once
        second = Deployment(provider, first.cluster, tmp_path, "{}",
                            command=[sys.executable, str(script)], stop_grace_s=0.3)
        second.prepare_all()
        codes = {k: t.process.wait(10) for k, t in first.tasks.items() if k != (Role.WORKER, 1)}
        assert set(codes.values()) == {EXIT_LEASE_LOST}, codes
    finally:
        for deployment in (first, second):
            if deployment is not None:
                deployment.teardown()
        provider.release(cluster)
    assert_no_process_left(first)
