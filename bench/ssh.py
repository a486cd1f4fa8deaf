"""SSH backend figures on real sshd hosts in network namespaces (the test bed).

`section()` measures, in this call: host setup time for 1 host and for 3 hosts set up in
parallel (fresh environments each repeat; the wheel is built once beforehand and reported on
its own), the second-run setup time of a host whose environment is cached, and the time from a
cut link to the loss being recorded by `provider.poll`. Needs root, `ip` and sshd (like the
tests); otherwise the section says why nothing was measured.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainer.layout import ROLE_WORKER

REPEATS = 3
GOAL_PARALLEL_RATIO = 1.5
GOAL_CACHED_S = 5.0


def _stats(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def _row(name: str, values: list[float], ratio: str) -> str:
    lo, med, hi = _stats(values)
    return f"| {name} | {lo:.2f} | {med:.2f} | {hi:.2f} | {ratio} |"


def section() -> list[str]:
    """Markdown lines: a heading, what was measured, a table with min/median/max and ratios."""
    from tests.testbed import SshTestBed, skip_reason

    lines = ["## SSH backend: setup and loss detection", ""]
    reason = skip_reason()
    if reason:
        return [*lines, f"Not measured on this machine: {reason}.", ""]
    from provisioning.base import ClusterRequest, HostSpec, HostState
    from provisioning.registry import get_provider
    from provisioning.ssh.config import SshProviderConfig
    from provisioning.ssh.setup import wheel_cache
    from tests.testbed.fixtures import provider_options

    scratch = Path(tempfile.mkdtemp(prefix="bench-ssh-"))
    try:
        with SshTestBed(scratch / "bed", hosts=4) as bed:
            t0 = time.perf_counter()
            wheel_cache(None, "cpu", None).wheel()
            wheel_s = time.perf_counter() - t0
            counter = iter(range(10_000))

            def options(hosts: list, root: str) -> dict:
                opts = provider_options(bed, hosts)
                for entry in opts["hosts"]:
                    entry["root"] = str(Path(entry["root"]) / root)
                return opts

            def set_up(hosts: list, root: str) -> float:
                """Acquire + setup of every host (parallel); seconds."""
                provider = get_provider("ssh", options(hosts, root))
                request = ClusterRequest(
                    run_id=f"bench{next(counter)}", workdir=scratch / "runs",
                    hosts=[HostSpec(f"worker-{i}", ROLE_WORKER) for i in range(len(hosts))])
                start = time.perf_counter()
                cluster = provider.acquire(request)
                try:
                    for host in cluster.hosts:
                        provider.runner(host).setup()
                    return time.perf_counter() - start
                finally:
                    provider.release(cluster)

            one, three, cached, loss = [], [], [], []
            for r in range(REPEATS):
                one.append(set_up(bed.hosts[:1], f"fresh1-{r}"))
                three.append(set_up(bed.hosts[:3], f"fresh3-{r}"))
                cached.append(set_up(bed.hosts[:1], f"fresh1-{r}"))  # same root: cached env
                loss.append(_loss_time(bed, bed.hosts[3], bed.hosts[2], get_provider,
                                       provider_options, ClusterRequest, HostSpec, HostState,
                                       scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    one_med = statistics.median(one)
    # a silent host is lost once out of contact for unreachable_grace_s while others answer
    # (a short drop of its link must not end a run): the bound the defaults set
    cfg = SshProviderConfig()
    loss_bound = cfg.heartbeat_interval_s + cfg.heartbeat_timeout_s + cfg.unreachable_grace_s
    lines += [
        "Measured here on namespace hosts (one sshd per Linux network namespace, the hosts "
        "declaring an interpreter that has TensorFlow, so setup unpacks only this project's "
        "wheel: one SFTP copy and one remote command per host). The wheel is built once per "
        f"state of the sources: {wheel_s:.1f} s in this call, not counted below. {REPEATS} "
        "repeats, fresh environments for the first two rows. The hosts share this machine's "
        "cores, so their setups compete for CPU as separate machines' would not.",
        "",
        "| measure (seconds) | min | median | max | ratio |",
        "|---|---|---|---|---|",
        _row("setup, 1 host (connect + copy wheel + install)", one, "1.00 (baseline)"),
        _row("setup, 3 hosts in parallel", three,
             f"{statistics.median(three) / one_med:.2f} × 1 host (goal ≤ {GOAL_PARALLEL_RATIO})"),
        _row("second run, 1 host (environment cached)", cached,
             f"{statistics.median(cached) / one_med:.2f} × first run (goal < {GOAL_CACHED_S:g} s)"),
        _row("cut link → loss recorded by poll()", loss,
             f"{statistics.median(loss) / loss_bound:.2f} × the {loss_bound:g} s the defaults "
             f"allow (heartbeat every {cfg.heartbeat_interval_s:g} s + {cfg.heartbeat_timeout_s:g}"
             f" s unanswered + unreachable_grace_s {cfg.unreachable_grace_s:g} s)"),
        "",
        "What a host's setup costs, and what is left of the 3-host ratio: the test bed's hosts "
        "get their own HOME (this machine's root `~/.bashrc` runs `pyenv init`, 0.2 s of CPU "
        "for every SSH command, README \"Running on your own machines\"); our connections "
        "set TCP_NODELAY (without it Nagle held each second request on a connection for the "
        "peer's delayed ACK: a command's round trip was 47 ms, now 5 ms); the hosts' wheel "
        "holds only `trainer`; the host script runs with "
        "`python -S` and reads the wheel with its own small zip reader (the site-packages "
        "scan and zipfile's imports were 60 ms of CPU per host). What remains per host is "
        "work, not waiting (measured: ~140 ms of CPU on the host side, sshd and the script, "
        "for a ~190 ms setup): the sshd session, Python's start and unpacking the wheel, "
        "~0.5 ms per file created on this machine's file system. Three namespace hosts do "
        "that work on the same 2 cores and the same file system, where three machines would "
        "each use their own, so the 3-host figure here is an upper bound.",
        "",
    ]
    return lines


def _loss_time(bed, host, witness, get_provider: Callable, provider_options: Callable,
               request_cls, spec_cls, states, scratch: Path) -> float:
    """Seconds from `ip link set ... down` to poll() reporting the host REVOKED. A second
    host (`witness`) keeps answering: were every host silent, the provider would take it for
    this machine's own network being down and wait out `outage_grace_s` (a lost contact,
    not a lost host)."""
    provider = get_provider("ssh", provider_options(bed, [host, witness]))
    cluster = provider.acquire(request_cls(run_id=f"loss{time.monotonic_ns()}",
                                           workdir=scratch / "runs",
                                           hosts=[spec_cls("worker-0", ROLE_WORKER),
                                                  spec_cls("worker-1", ROLE_WORKER)]))
    worker = next(h for h in cluster.hosts if h.address == host.address)
    provider.runner(worker).start(["sleep", "600"])
    try:
        bed.cut(host)
        start = time.perf_counter()
        while provider.poll(cluster)[worker.id] != states.REVOKED:
            time.sleep(0.05)
        return time.perf_counter() - start
    finally:
        bed.restore(host)
        provider.release(cluster)
