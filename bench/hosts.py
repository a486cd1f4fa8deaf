"""Bare hosts setting themselves up (issue 19 §4), on isolated hosts (tests/testbed/isolated.py).

`section()` measures, in this call, the setup (`runner.setup()`: SFTP of the wheel, the remote
script, the install) of one fresh isolated host
- from a bare Debian 13 image through the package index on the bed's bridge (the host
  downloads TensorFlow and the rest itself; `provider.index_url`),
- from a bare Debian 12 image through a wheelhouse made here for its cp311 (copied over SFTP;
  `provider.wheelhouse`; the download into the wheelhouse is done beforehand and not counted),
- a second run on the same host (its environment cached),
- from a "baked" image: the index host's disk snapshotted into an image layer (what a cloud's
  `images.insert` from a set-up VM's disk gives), 1 host and 16 hosts set up in parallel,
and the bytes the orchestrator copies to a host on each path; for the baked hosts also the CPU
seconds their setups used here and on the hosts (the floor of the 16-host time on this machine's
cores: what is left once nothing waits in series), and the last `make gce-fake`'s figures. One measurement each (a TF
install is minutes of the 2 shared cores); needs what the isolated bed needs, else says why.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from trainer.layout import ROLE_WORKER

GOAL_PARALLEL_RATIO = 1.5
GOAL_CACHED_S = 5.0
MANY = 16


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds of `pids` and of their reaped children (/proc/PID/stat utime, stime,
    cutime, cstime): a host's sessions, counted by the host's own processes."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone: its time is in the parent that reaped it
        total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _headline_lines() -> list[str]:
    """The last passing `make gce-fake` on this machine (the test writes its figures; a bench
    run does not repeat the 10-minute sweep)."""
    path = Path(__file__).resolve().parent.parent / ".bench" / "gce-fake.json"
    if not path.exists():
        return ["No `make gce-fake` result is on record in this checkout (`.bench/gce-fake.json`, "
                "written by its test when it passes; `make ci` runs it).", ""]
    t = json.loads(path.read_text())
    return [f"The headline on the fake (`make gce-fake`: `+experiment=cifar10_res32 -m "
            f"cluster.workers=4,8,16`, isolated hosts, a baked image), last passed "
            f"{t['date']}: the bake {t['bake_s']:.0f} s, the 3-cluster sweep "
            f"{t['sweep_s']:.0f} s ({t['cores']} cores, load average {t['load']} at its end).",
            ""]


def section() -> list[str]:
    from tests.testbed import isolated

    lines = ["## Bare hosts: setup from a bare image, a wheelhouse, a baked image", ""]
    reason = isolated.skip_reason()
    if reason:
        return [*lines, f"Not measured on this machine: {reason}.", ""]
    from provisioning import host_runtime
    from provisioning.base import ClusterRequest, HostSpec
    from provisioning.registry import get_provider
    from provisioning.ssh.setup import wheel_cache
    from tests.testbed import wheelhouse
    from tests.testbed.isolated import IsolatedTestBed

    runtime = host_runtime.load()
    scratch = Path(tempfile.mkdtemp(prefix="bench-hosts-"))
    counter = iter(range(10_000))
    try:
        with IsolatedTestBed() as bed:
            url = bed.serve_index(wheelhouse.wheelhouse([*runtime.requirements("cpu"), "pip"],
                                                        "3.13"))
            house = scratch / "wheelhouse"

            cpu: dict[str, float] = {}  # of the last set_up: orchestrator, hosts

            def set_up(hosts: list, **keys: object) -> tuple[float, list]:
                options = {"hosts": bed.inventory(hosts), "known_hosts": str(bed.known_hosts),
                           "stop_grace_s": 1.0, "index_url": url, **keys}
                provider = get_provider("ssh", options)
                cluster = provider.acquire(ClusterRequest(
                    run_id=f"bench{next(counter)}", workdir=scratch / "runs",
                    hosts=[HostSpec(f"worker-{i}", ROLE_WORKER) for i in range(len(hosts))]))
                try:
                    runners = [provider.runner(h) for h in cluster.hosts]
                    pids = [p for h in hosts for p in bed.pids(h)]
                    host_cpu, own_cpu = _cpu_s(pids), time.process_time()
                    start = time.perf_counter()
                    for runner in runners:
                        runner.setup()  # the first sets every host up in parallel
                    wall = time.perf_counter() - start
                    cpu.update(orchestrator=time.process_time() - own_cpu, hosts=_cpu_s(
                        [p for h in hosts for p in bed.pids(h)]) - host_cpu)
                    return wall, [r.machine.environment for r in runners]
                finally:
                    provider.release(cluster)

            wheel = wheel_cache(None, "cpu", url).wheel()
            wheel_bytes = wheel.path.stat().st_size

            index_host = bed.add_host(image="trixie")
            bed.wait_login(index_host)
            index_s, _ = set_up([index_host])
            cached_s, (env,) = set_up([index_host])
            assert not env.deps_installed and not env.installed

            house_host = bed.add_host(image="bookworm")
            bed.wait_login(house_host)
            key = f"{runtime.digest('cpu')}-cp311-glibc2.36-x86_64"
            folder = wheel_cache(str(house), "cpu", None).wheelhouse_for(key, 11, (2, 36),
                                                                          "x86_64")
            house_bytes = sum(p.stat().st_size for p in folder.glob("*.whl"))
            house_s, (env,) = set_up([house_host], index_url=None, wheelhouse=str(house))
            assert env.mode == "wheelhouse" and env.deps_installed

            # the image carries the venv, not this run's wheel, environment or run files
            bed.ssh(index_host, "cd ~/.transient && rm -rf wheels runs envs/[0-9a-f]*")
            bed.stop(index_host)
            baked = bed.snapshot(index_host, scratch / "baked-layer")
            one = bed.add_host(disk=baked)
            many = [bed.add_host(disk=baked) for _ in range(MANY)]
            for host in [one, *many]:
                bed.wait_login(host)
            baked_s, (env,) = set_up([one])
            one_cpu = dict(cpu)
            assert not env.deps_installed  # the image's venv is used as it is
            load_before = os.getloadavg()[0]
            many_s, envs = set_up(many)
            many_cpu, load_after = dict(cpu), os.getloadavg()[0]
            assert not any(e.deps_installed for e in envs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    mb = 1024 * 1024
    lines += [
        "Measured on isolated hosts (own root filesystem, pid/mount/network namespaces, user "
        "`cloud`, no TensorFlow in the image; tests/testbed/isolated.py) on this 2-core "
        "machine (the load average is given below); one measurement each. Setup "
        "= `runner.setup()` after the connection: copying our wheel, the remote script, the "
        "install. The index is pypiserver on the bed's bridge (a cloud VM reaches PyPI at "
        "in-cloud speed instead).",
        "",
        "| path | setup (s) | ratio | bytes copied from the orchestrator |",
        "|---|---|---|---|",
        f"| bare Debian 13 (3.13), from the index on the host | {index_s:.1f} | 1.00 (baseline) "
        f"| {wheel_bytes / 1024:.0f} KB (our wheel) |",
        f"| bare Debian 12 (3.11), from a wheelhouse made for it | {house_s:.1f} | "
        f"{house_s / index_s:.2f} × index | {(house_bytes + wheel_bytes) / mb:.0f} MB "
        "(the wheelhouse, once per host, and our wheel) |",
        f"| second run, same host (environment cached) | {cached_s:.2f} | "
        f"{cached_s / index_s:.3f} × index (goal ≤ {GOAL_CACHED_S:g} s) | 0 (wheel already "
        "there) |",
        f"| baked image (the index host's disk as an image layer), 1 host | {baked_s:.2f} | "
        f"{baked_s / index_s:.3f} × index | {wheel_bytes / 1024:.0f} KB |",
        f"| baked image, {MANY} hosts in parallel | {many_s:.2f} | {many_s / baked_s:.2f} × 1 "
        f"baked host (goal ≤ {GOAL_PARALLEL_RATIO}) | {wheel_bytes / 1024:.0f} KB each |",
        "",
        "Reading: from the index only our wheel crosses the orchestrator's link; the wheelhouse "
        "path copies the whole set over SFTP once per host (later runs copy nothing). A host "
        "whose environment is cached, or made from a baked image, only has our wheel unpacked "
        f"(if new): {cached_s * 1000:.0f} ms and {baked_s * 1000:.0f} ms here. The {MANY} baked "
        f"hosts' setups are the same CPU work ({many_s / MANY * 1000:.0f} ms per host on "
        "average) done by the same 2 cores and file system here, where "
        f"{MANY} VMs would each use their own: the parallel ratio on this machine is CPU-bound "
        "and says nothing about network waits (there are none left to overlap).",
        "",
        f"Where the time goes (CPU seconds, this process's threads and the hosts' processes): "
        f"1 baked host {one_cpu['orchestrator']:.3f} s here + {one_cpu['hosts']:.3f} s on the "
        f"host; {MANY} baked hosts {many_cpu['orchestrator']:.2f} s here + "
        f"{many_cpu['hosts']:.2f} s on the hosts, {sum(many_cpu.values()) / MANY * 1000:.0f} ms "
        f"per host. On {os.cpu_count()} cores that is a floor of "
        f"{sum(many_cpu.values()) / (os.cpu_count() or 1):.2f} s for the {MANY} setups, "
        f"{many_s / (sum(many_cpu.values()) / (os.cpu_count() or 1)):.1f} × of it measured "
        f"(load average {load_before:.1f} before, {load_after:.1f} after): "
        f"the setups run in parallel ({MANY} threads, one SSH connection each), and what is "
        f"left is CPU, which {MANY} VMs would not share.",
        "",
        *_headline_lines(),
    ]
    return lines
