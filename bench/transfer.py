"""What crosses the orchestrator's link per host: a first run, a restart, and a second run.

`section()` runs, in this call, the real CLI with `provider=ssh` on the shared-filesystem SSH
test bed (tests/testbed: one sshd per network namespace) on a file-backed problem
(`image_cifar10`, a small archive in the real format served over HTTP on the bed's bridge,
as the dataset's source URL), with a second parameter server revoked mid-run so that every
role restarts from the checkpoint (a new deployment on the surviving machines), then the same
command again on the same hosts. It reads the `host_setup` events (orchestrator/runtime/
deploy.py): the bytes each machine was sent while it was set up, counted on its SSH socket
(the wheel, the setup script, the spec, the lease, the data commands, a push), and how it
got the dataset; and the time from the hosts' connection (`provisioned`) to the first
training step. The same figures on the fake cloud (the headline's experiment, isolated VMs
from the baked image, a restart onto a new VM): bench/cloud_transfer.py; this bed adds a second
run on the same hosts. Needs root, `ip` and sshd (like the tests); otherwise the section says
why nothing was measured.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.rundir.results import EVENT_PROVISIONED, EVENT_START
from orchestrator.runtime.deploy import EVENT_HOST_SETUP
from provisioning.checkout import PROJECT_ROOT as ROOT
from trainer.events import EVENT_STEP

GOAL_FIRST_BYTES = 1_000_000  # per host: the wheel and the specs, no dataset
GOAL_RESTART_BYTES = 100_000  # per host and restart

RUN = ["+experiment=ssh_digits", "provider=testbed", "job.problem=image_cifar10",
       "cluster.workers=1", "cluster.parameter_servers=2", "cluster.ps_transient=true",
       "cluster.recovery.on_revocation=replace", "job.train_steps=300",
       "job.checkpoint_frequency=50", "job.eval_frequency=0", "job.batch_size=8",
       "progress=false", "preflight=false"]
REVOKE = ["revocation=schedule", "revocation.events=[{target: ps-1, at_step: 120}]"]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


#: `python -m orchestrator ARGS` with the registry's cifar10 entry carrying the served test
#: archive's checksum and size (as the tests' monkeypatch does): the orchestrator hands both to
#: the hosts with the URL, so only this process needs it.
_WITH_TEST_ARCHIVE = (
    "import dataclasses, runpy, sys\n"
    "from trainer import datasets\n"
    "md5, size, *args = sys.argv[1:]\n"
    "ds = datasets.DATASETS['cifar10']\n"
    "entry = dataclasses.replace(ds.archive('bin'), md5=md5, size=int(size))\n"
    "datasets.DATASETS['cifar10'] = dataclasses.replace(ds, archives=(entry,))\n"
    "sys.argv = ['orchestrator', *args]\n"
    "runpy.run_module('orchestrator', run_name='__main__', alter_sys=True)\n")


def _run(args: list[str], env: dict[str, str], md5: str,
         size: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _WITH_TEST_ARCHIVE, md5, str(size), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _kb(n: float) -> str:
    return f"{n / 1000:.1f} KB"


def _phases(events: list[dict]) -> list[dict]:
    """Each deployment's setups (split at each `start`) and its first step after."""
    phases: list[dict] = []
    for e in events:
        if e["kind"] == EVENT_START:
            phases.append({"t0": e["time"], "setups": [], "first_step": None})
        elif e["kind"] == EVENT_PROVISIONED:
            provisioned = e["time"]
        elif phases and e["kind"] == EVENT_HOST_SETUP:
            phases[-1]["setups"].append(e)
        elif phases and e["kind"] == EVENT_STEP and phases[-1]["first_step"] is None:
            phases[-1]["first_step"] = e["time"]
    if phases:
        phases[0]["t0"] = provisioned  # the first deployment: from the hosts' connection
    return phases


def section() -> list[str]:
    """Markdown lines: heading, what was run, a table per deployment and host."""
    from tests.testbed import SshTestBed, skip_reason

    lines = ["## Bytes from the orchestrator per host: first run, restart, second run", ""]
    reason = skip_reason()
    if reason:
        return [*lines, f"Not measured on this machine: {reason}.", ""]
    sys.path.insert(0, str(ROOT / "tests" / "trainer"))  # the archive server and writers
    from cifar_server import ArchiveServer, make_archive

    from tests.testbed.fixtures import provider_options, write_provider_file
    from trainer import datasets

    scratch = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    try:
        with SshTestBed(scratch / "bed", hosts=4) as bed:
            archive = make_archive("cifar-10-binary.tar.gz")
            conf = write_provider_file(scratch / "conf", "testbed",
                                       provider_options(bed, bed.hosts, spares=1))
            with ArchiveServer(bed.gateway) as srv:
                srv.behaviour.files[archive.name] = archive.data
                # the registry entry with the test archive's checksum: the orchestrator and
                # the hosts read it from the same source, $TRANSIENT_DATA_MIRROR
                env = {**os.environ, "PYTHONPATH": str(ROOT), datasets.MIRROR_ENV: srv.base_url}
                env.pop("HYDRA_FULL_ERROR", None)
                common = [*RUN, f"data_cache={scratch / 'cache'}",
                          f"hydra.searchpath=[file://{conf}]"]
                runs = []
                for i, extra in enumerate((REVOKE, [])):
                    run_dir = scratch / f"run{i}"
                    res = _run([*common, *extra, f"hydra.run.dir={run_dir}"], env,
                               archive.md5, len(archive.data))
                    if res.returncode != 0:
                        return [*lines, f"Not measured: run {i} failed "
                                f"(exit {res.returncode}): {res.stderr.strip()[-600:]}", ""]
                    runs.append(_events(run_dir))
                fetches = [r["client"] for r in srv.behaviour.requests
                           if r["client"] != bed.gateway]  # the gateway: this machine
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [*lines, *_table(runs, fetches, len(archive.data))]


def _table(runs: list[list[dict]], fetches: list[str], archive_bytes: int) -> list[str]:
    first, second = runs
    deployments = [("first run", _phases(first)[0])]
    deployments += [(f"restart {i}", p) for i, p in enumerate(_phases(first)[1:], 1)]
    deployments += [("second run, same hosts", _phases(second)[0])]
    out = [
        "Measured on the shared-filesystem SSH bed (4 namespace hosts, one a spare, hosts "
        "declaring this venv's interpreter: setup unpacks only our wheel), one run of "
        f"`{' '.join(RUN[:2])}` with `{' '.join(RUN[2:7])}` and ps-1 revoked at step 120 "
        "(every role restarts from the checkpoint, ps-1 on the spare), then the same run "
        "without the revocation on the same hosts. The dataset's source is an HTTP server on "
        f"the bed's bridge serving a {_kb(archive_bytes)} archive in the real format: the hosts "
        f"downloaded it {len(fetches)} time(s) in all "
        f"({', '.join(sorted(set(fetches))) or 'none'}: once per machine that reads it, in "
        "the first run), besides the orchestrator's own data step. "
        "Bytes are everything written to the machine's SSH socket during its setup in that "
        "deployment (`host_setup` event: setup, spec, lease, data commands, any push). Goals: "
        f"a machine's first setup < {_kb(GOAL_FIRST_BYTES)} (our wheel and the specs, no "
        f"dataset), a restart or a later run on a host that holds everything < "
        f"{_kb(GOAL_RESTART_BYTES)}; the restart's replacement of ps-1 is a new machine.",
        "",
        "| deployment | machine (its first role) | new machine | dataset | bytes sent | goal "
        "| setup s |",
        "|---|---|---|---|---|---|---|",
    ]
    seen: set[str] = set()  # machine ids set up before: a restart's goal applies to them
    for name, phase in deployments:
        if name.startswith("second run"):
            seen = set()  # another run: new machine ids, the same hosts' disks
        for s in sorted(phase["setups"], key=lambda e: (e["role"], e["index"])):
            sent, new = s.get("bytes_sent"), s["machine"] not in seen
            seen.add(s["machine"])
            limit = GOAL_FIRST_BYTES if new and name != "second run, same hosts" \
                else GOAL_RESTART_BYTES
            verdict = "" if sent is None else ("met" if sent < limit else "MISSED")
            shown = "same host" if name.startswith("second run") else "yes" if new else "no"
            out.append(f"| {name} | {s['role']}-{s['index']} | {shown} | "
                       f"{s.get('data') or '-'} | {'-' if sent is None else _kb(sent)} | "
                       f"< {_kb(limit)} {verdict} | {s['setup_s']:.2f} |")
    out.append("")
    waits = [(name, p["first_step"] - p["t0"]) for name, p in deployments
             if p["first_step"] is not None]
    out.append("Time to the first training step: " + "; ".join(
        f"{name} {s:.1f} s" for name, s in waits) + " (first run: from the hosts' "
        "connection, the `provisioned` event; later deployments: from their `start`). "
        f"Median host setup {statistics.median(s['setup_s'] for _, p in deployments for s in p['setups']):.2f} s.")
    out.append("")
    return out
