"""The headline on the fake cloud: bytes from the orchestrator per VM, and RUNNING → first step.

`section()` runs, in this call, the real CLI (`+experiment=cifar10_res32`, 2 Spot workers, a
short step budget, batch 2) against the fake Compute API whose VMs are isolated hosts
(tests/testbed/isolated.py: own root filesystem and network, Debian 13's Python) booted from
the baked image cached on this machine (tests/testbed/baked.py: `orchestrator.image bake`'s
image, as the fault end-to-end tests use it; built once if missing, never here otherwise). The
dataset is the registry's `cifar10` whose source is a small archive in the real format served
over HTTP on the bed's bridge (`$TRANSIENT_DATA_MIRROR`, as bench/transfer.py): each VM that
reads it fetches it itself. Mid-run a worker's Spot VM is preempted (replaced by a new VM), and
later the PS's VM (chief and evaluator colocated: re-created, every role restarts from the last
checkpoint, the surviving workers' VMs get a restart deployment). `provider.storage` names a
bucket in gcp-storage-emulator on the bed's bridge (the VMs' Cloud Storage): checkpoints are
mirrored there, and the PS's re-created VM downloads them from it itself.

Read back: the `host_setup` events (orchestrator/runtime/deploy.py) with the bytes written to
each machine's SSH sockets (`bytes_sent_total`: since the machine was first connected, host-key
wait and login included; `bytes_sent`: in this deployment), and how it got the dataset; each
VM's RUNNING time from the fake (`FakeInstance.running_since`, what the API reports); the
chief's first `step` and each worker's first `worker_steps` event after the VM's setup (both
throttled by the chief's reporting, so an upper bound). ROUNDS runs on one bed, a fresh fake
cloud each (1–2 minutes each on the 2-core machine). Needs root, `ip` and the isolated
images; otherwise the section says why nothing was measured. The raw figures of the last
measurement go to `.bench/cloud-transfer.json`; `table()` turns them into the section.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.transfer import _WITH_TEST_ARCHIVE, GOAL_FIRST_BYTES, GOAL_RESTART_BYTES, _events, _kb
from orchestrator.rundir.results import EVENT_START, ROLE_ORCHESTRATOR
from orchestrator.runtime.deploy import EVENT_HOST_SETUP
from orchestrator.transient.recovery import EVENT_REPLACEMENT_READY
from provisioning.checkout import PROJECT_ROOT as ROOT
from trainer.events import EVENT_READY, EVENT_STEP, EVENT_WORKER_STEPS
from trainer.layout import ROLE_PS, ROLE_WORKER

RAW = ROOT / ".bench" / "cloud-transfer.json"
GOAL_BEYOND_BOOT_S = 30.0  # RUNNING → first step, less the boot, with a baked image
WORKERS = 2
TRAIN_STEPS = 300
PREEMPT_WORKER_AT = 60  # the first `step` event at or past it: a worker's VM is preempted
PREEMPT_PS_AT = 160  # then, once the replacement trains, the PS's VM
RUN_TIMEOUT_S = 900
BUCKET = "bench"  # provider.storage's bucket, in an emulator on the bed's bridge
ROUNDS = 3  # 1–2 minutes each on the 2-core machine
RUN = ["+experiment=cifar10_res32", f"cluster.workers={WORKERS}",
       f"job.train_steps={TRAIN_STEPS}", "job.batch_size=2", "job.checkpoint_frequency=50",
       "job.eval_frequency=0", "cluster.recovery.on_revocation=replace",
       "cluster.recovery.replacement_delay_s=0", "cluster.recovery.restart_delay_s=0",
       "preflight=false", "progress=false"]


def _vm_facts(fake: Any) -> list[dict[str, Any]]:
    """Every VM the fake made: name, role label, address, RUNNING time, preempted."""
    return [{"name": i.name, "role": i.body.get("labels", {}).get("role"), "ip": i.ip,
             "running": i.running_since(), "preempted": i.preempted}
            for i in fake.instances.values()]


def _wait_for(run_dir: Path, proc: subprocess.Popen[str], deadline: float,
              reached: Any, what: str) -> None:
    while not reached(_read_events(run_dir)):
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {RUN_TIMEOUT_S} s")
        time.sleep(0.3)


def _read_events(run_dir: Path) -> list[dict]:
    with contextlib.suppress(OSError, ValueError):
        return _events(run_dir)
    return []


@contextlib.contextmanager
def _bucket(address: str) -> Iterator[str]:
    """gcp-storage-emulator in memory on `address` (the bed's bridge: the VMs' Cloud Storage)
    holding BUCKET; yields its URL (the run's STORAGE_EMULATOR_HOST)."""
    import logging

    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = create_server(address, 0, in_memory=True, default_bucket=BUCKET)
    server.start()
    try:
        yield f"http://{address}:{server._api._httpd.server_address[1]}"
    finally:
        server.stop()


def _step_at(n: int, after: float = 0.0):  # -> Callable[[list[dict]], bool]
    return lambda evs: any(e["kind"] == EVENT_STEP and e.get("step", 0) >= n and e["time"] > after
                           for e in evs)


def measure() -> dict[str, Any] | str:
    """Run the headline ROUNDS times as the module docstring says (one bed, a fresh fake cloud
    per round); the raw figures, or why nothing was measured."""
    from tests.testbed import baked, isolated

    reason = isolated.skip_reason()
    if reason:
        return reason
    sys.path.insert(0, str(ROOT / "tests" / "trainer"))  # the archive server and writer
    from cifar_server import ArchiveServer, make_archive

    runtime = baked.build()  # cached under /var/tmp/transient-isobed: normally no work
    scratch = Path(tempfile.mkdtemp(prefix="bench-cloud-transfer-"))
    archive = make_archive("cifar-10-binary.tar.gz")
    started = time.monotonic()
    try:
        with isolated.IsolatedTestBed() as bed, ArchiveServer(bed.gateway) as srv:
            srv.behaviour.files[archive.name] = archive.data
            rounds = [_round(bed, srv, archive, runtime, scratch / f"round{i}")
                      for i in range(ROUNDS)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "wall_s": round(time.monotonic() - started, 1), "cores": os.cpu_count(),
              "load": round(os.getloadavg()[0], 1), "archive_bytes": len(archive.data),
              "rounds": rounds}
    RAW.parent.mkdir(exist_ok=True)
    RAW.write_text(json.dumps(result) + "\n")
    return result


def _round(bed: Any, srv: Any, archive: Any, runtime: Any, scratch: Path) -> dict[str, Any]:
    """One run on a fresh fake cloud of `bed`: its events, the fake's VMs, the VMs' fetches."""
    from tests.fakes.isolated_gce import FAKE_TIMES, ZONES, IsolatedFakeGce, provider_args
    from trainer import datasets

    run_dir = scratch / "run"
    fetched_before = len(srv.behaviour.requests)
    # 3 VMs, the worker's replacement, the PS's re-creation, one spare address
    with IsolatedFakeGce(bed, vms=WORKERS + 4, zones=ZONES, **FAKE_TIMES) as fake, \
            _bucket(bed.gateway) as storage_url:
        image = fake.add_image(runtime.name, runtime.disk)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(ROOT), datasets.MIRROR_ENV: srv.base_url,
               "GOOGLE_CLOUD_PROJECT": fake.project, "STORAGE_EMULATOR_HOST": storage_url}
        env.pop("HYDRA_FULL_ERROR", None)
        argv = [sys.executable, "-c", _WITH_TEST_ARCHIVE, archive.md5, str(len(archive.data)),
                *RUN, *provider_args(fake, bed), f"provider.image={image}",
                f"provider.storage=gs://{BUCKET}/runs",
                f"data_cache={scratch / 'cache'}", f"hydra.run.dir={run_dir}"]
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            _wait_for(run_dir, proc, deadline, _step_at(PREEMPT_WORKER_AT),
                      f"step {PREEMPT_WORKER_AT}")
            worker = next(i for i in fake.live_instances()
                          if i.body["labels"]["role"] == ROLE_WORKER)
            fake.preempt(worker.zone, worker.name)
            preempted = time.time()
            _wait_for(run_dir, proc, deadline,
                      lambda evs: any(e["kind"] == EVENT_REPLACEMENT_READY for e in evs),
                      "replacement")
            _wait_for(run_dir, proc, deadline, _step_at(PREEMPT_PS_AT, preempted),
                      f"step {PREEMPT_PS_AT} after the replacement")
            ps = next(i for i in fake.live_instances()  # labelled ps_chief_evaluator
                      if ROLE_PS in i.body["labels"]["role"].split("_"))
            fake.preempt(ps.zone, ps.name)
            out, _ = proc.communicate(timeout=max(10, deadline - time.monotonic()))
        except BaseException as err:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            if not isinstance(err, RuntimeError):  # not the run's own failure: the bench's
                raise
            return {"exit": proc.returncode or -1, "output_tail": f"{err}; {out[-3000:]}"}
        fetches = [r["client"] for r in srv.behaviour.requests[fetched_before:]
                   if r["client"] != bed.gateway]  # the gateway: the orchestrator's own fetch
        return {"exit": proc.returncode, "output_tail": out[-3000:],
                "wall_s": round(time.monotonic() - started, 1),
                "boot_s": fake.login_refused_s, "fetches": fetches, "vms": _vm_facts(fake),
                "events": _read_events(run_dir)}


def section() -> list[str]:
    """Markdown lines: heading, what was run and on what, a table per VM and deployment."""
    lines = ["## Bytes from the orchestrator per VM and RUNNING → first step, on the fake cloud",
             ""]
    result = measure()
    if isinstance(result, str):
        return [*lines, f"Not measured on this machine: {result}.", ""]
    return [*lines, *table(result)]


def setups(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per `host_setup` event of one round, in time order: its deployment (`first`, `replacement`
    for a new VM set up between deployments, `restart N` after the N+1th `start`), whether
    its machine is new, the bytes against the goal that applies (a new VM: everything since
    it was first connected; a VM set up again: that setup's), and for a new VM its RUNNING
    time (the fake's VM at that address that was RUNNING before the setup ended) and its
    first training step after it (the chief's `step` for the PS's VM, the worker's own
    `worker_steps` for a worker's)."""
    evs = sorted(run["events"], key=lambda e: e["time"])
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    starts, deployed = 0, False
    for e in evs:
        if e["kind"] == EVENT_START:
            starts, deployed = starts + 1, False
        elif e["kind"] == EVENT_READY and e["role"] == ROLE_ORCHESTRATOR:
            deployed = True
        if e["kind"] != EVENT_HOST_SETUP:
            continue
        new = e["machine"] not in seen
        seen.add(e["machine"])
        vm = max((v for v in run["vms"] if v["ip"] == e["address"]
                  and v["running"] <= e["time"]), key=lambda v: v["running"], default=None)
        since = e["time"]  # a lost worker's last reports may trail its replacement's RUNNING
        if e["role"] == ROLE_WORKER:
            first = next((x["time"] for x in evs if x["kind"] == EVENT_WORKER_STEPS
                          and x.get("worker") == e["index"] and x["time"] > since), None)
        else:
            first = next((x["time"] for x in evs if x["kind"] == EVENT_STEP and x["time"] > since),
                         None)
        to_step = None if first is None or vm is None or not new else first - vm["running"]
        rows.append({
            "deployment": ("replacement" if new and deployed else "first" if starts <= 1
                           else f"restart {starts - 1}"),
            "host": f"{e['role']}-{e['index']}", "new": new, "data": e.get("data"),
            "bytes": e["bytes_sent_total"] if new else e["bytes_sent"],
            "before_setup": (e["bytes_sent_total"] - e["bytes_sent"]) if new else 0,
            "goal": GOAL_FIRST_BYTES if new else GOAL_RESTART_BYTES, "setup_s": e["setup_s"],
            "to_step_s": to_step,
            "beyond_boot_s": None if to_step is None else to_step - run["boot_s"],
            "start_to_step_s": None if new or first is None else first - _last_start(evs, e)})
    return rows


def _last_start(evs: list[dict], before: dict) -> float:
    return max(e["time"] for e in evs if e["kind"] == EVENT_START and e["time"] <= before["time"])


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _size(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else _kb(n)


def _spread(values: list[float], fmt: Any = _s) -> str:
    """min / median / max, the value alone when all are equal, - when there is none."""
    if not values:
        return "-"
    shown = [fmt(v) for v in (min(values), statistics.median(values), max(values))]
    if shown[0] == shown[2]:
        return shown[0]
    units = {x.rpartition(" ")[2] for x in shown if " " in x}
    if len(units) == 1 and all(" " in x for x in shown):  # "1.0 / 2.0 / 3.0 KB"
        shown = [x.rpartition(" ")[0] for x in shown[:2]] + shown[2:]
    return " / ".join(shown)


def table(result: dict[str, Any]) -> list[str]:
    """The section's text and table from `measure()`'s raw figures (pure: tested alone)."""
    failed = [r for r in result["rounds"] if r["exit"] != 0]
    if failed:
        return [f"Not measured: a run failed (exit {failed[0]['exit']}): "
                f"{' '.join(failed[0]['output_tail'].split())[-600:]}", ""]
    n = len(result["rounds"])
    cells: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for run in result["rounds"]:
        for row in setups(run):
            cells.setdefault((row["deployment"], row["host"], row["new"]), []).append(row)
    boot = result["rounds"][0]["boot_s"]
    fetches = [len(r["fetches"]) for r in result["rounds"]]
    out = [
        f"Measured {result['date']} on the fake Compute API (tests/fakes/gce_server.py) whose "
        "VMs are isolated hosts on this machine (tests/fakes/isolated_gce.py: own root "
        "filesystem and network namespace, Debian 13's Python, logins refused for "
        f"{boot:.0f} s after RUNNING: the fake's boot), booted from the baked image "
        "(tests/testbed/baked.py), every VM and the orchestrator sharing this machine's "
        f"{result['cores']} cores (load average {result['load']} at the end). {n} runs "
        f"({_spread([r['wall_s'] for r in result['rounds']], lambda v: f'{v:.0f}')} s each, "
        f"{result['wall_s']:.0f} s in all) of `{' '.join(RUN[:2])}` through the real CLI: "
        f"{TRAIN_STEPS} steps of batch 2, 1 VM for the PS, chief and evaluator + 2 Spot worker "
        f"VMs; a worker's VM preempted at step {PREEMPT_WORKER_AT} (replaced by a new VM), then "
        f"the PS's VM at step {PREEMPT_PS_AT} (re-created: every role restarts from the last "
        "checkpoint, the workers' VMs are set up again). The dataset is the registry's "
        f"`cifar10`, its source a {_kb(result['archive_bytes'])} archive in the real format on "
        f"an HTTP server on the bed's bridge: the VMs downloaded it {_spread(fetches, str)} "
        "time(s) per run themselves (the VMs whose roles read files: the PS's, where the chief "
        "and evaluator run, and its re-creation), none of it over the orchestrator's SSH links.",
        "",
        "Bytes: written to the VM's SSH sockets by the orchestrator (`host_setup` event): for a "
        "new VM everything since it was first connected (host-key wait, login, setup, spec, "
        "lease, data commands, and for a new chief's VM the checkpoint folder), for a VM set up "
        "again that setup's. RUNNING: the fake's API status. First step: the chief's `step` "
        "for the PS's VM, the worker's own `worker_steps` for a worker's (both reported at most "
        "every few seconds: an upper bound). Beyond the boot: RUNNING → first step less the "
        f"fake's {boot:.0f} s boot (what is left: waiting for the other VMs, setup, the roles' "
        "start, the chief's model and trace), goal "
        f"< {GOAL_BEYOND_BOOT_S:.0f} s; a real VM's boot from a baked image comes on top. "
        f"Figures are min / median / max over the {n} runs (one value: all equal); a goal is "
        "met when the worst run meets it.",
        "",
        "| deployment | VM (its first role) | new VM | dataset | bytes sent | goal | setup s "
        f"| RUNNING → first step s | beyond the boot s (goal < {GOAL_BEYOND_BOOT_S:.0f}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = list(dict.fromkeys(key[0] for key in cells))  # deployments as they happened
    for (deployment, host, new), rows in sorted(cells.items(),
                                                 key=lambda c: (order.index(c[0][0]), c[0][1])):
        goal = rows[0]["goal"]
        sent = [r["bytes"] for r in rows]
        beyond = [r["beyond_boot_s"] for r in rows if r["beyond_boot_s"] is not None]
        verdict = "" if not beyond else " met" if max(beyond) < GOAL_BEYOND_BOOT_S else " MISSED"
        out.append(
            f"| {deployment} | {host} | {'yes' if new else 'no'} | "
            f"{', '.join(sorted({str(r['data'] or '-') for r in rows}))} | {_spread(sent, _size)} | "
            f"< {_size(goal)} {'met' if max(sent) < goal else 'MISSED'} | "
            f"{_spread([r['setup_s'] for r in rows], lambda v: f'{v:.2f}')} | "
            f"{_spread([r['to_step_s'] for r in rows if r['to_step_s'] is not None])} | "
            f"{_spread(beyond)}{verdict} |")
    every = [r for rows in cells.values() for r in rows]
    again = [r["start_to_step_s"] for r in every if r["start_to_step_s"] is not None]
    pushed = [r["before_setup"] for r in every if r["before_setup"] > GOAL_FIRST_BYTES]
    out += ["", "A restart's `start` → the set-up-again workers' first step: "
            f"{_spread(again)} s (the chief's restore and trace on its new VM)."]
    if pushed:
        out[-1] += (
            f" The re-created PS's VM got {_spread(pushed, _size)} before its setup: the run's "
            "checkpoint folder, copied from the orchestrator's machine onto a new chief's VM "
            "before it starts (`CheckpointStore.before_start`; with `provider.storage` too, the "
            "bucket store mirrors through that folder), so a restart onto a new VM misses the "
            "goal by the checkpoints' size.")
    return [*out, ""]


if __name__ == "__main__":
    print("\n".join(section()))
