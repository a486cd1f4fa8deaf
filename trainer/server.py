"""The ps and worker roles: a gRPC `tf.distribute.Server` that serves until stopped.

Its gRPC server keeps gRPC's default ping policy (TF passes it no channel arguments): the
clients' keepalive is set to agree with it (trainer/keepalive.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from trainer import events
from trainer.control import unreachable
from trainer.layout import ROLE_CHIEF, ROLE_PS, ROLE_WORKER
from trainer.spec import TrainerSpec
from trainer.startup import STARTUP, import_server_lib

# Small pools: on a 2-core host every role shares the same cores, and TF's default of one
# thread per core per pool in every process oversubscribes them badly. A worker's kernels
# (intra-op) get the host's cores shared among the workers on that host (`intra_op_threads`):
# a lone worker on a many-core VM must not compute on one thread.
INTER_OP_THREADS = 2
PS_INTRA_OP_THREADS = 1  # a PS applies updates; its kernels are small
# The kernel may deliver SIGTERM to any of TF's threads; Python then runs the handler only
# when the main thread next executes bytecode. Short sleeps bound that delay.
SIGNAL_POLL_S = 0.2
# A server that joins a job already training (a replacement: the chief, which starts its
# server only after every ps and worker answered, already serves) imports TensorFlow in a
# thread at this nice value: on a shared host (the local backend: every role on the same
# cores) its import CPU would otherwise come out of the survivors' training, which then ran
# at ~70 % until it was done. Nice is per thread on Linux, and the server's own threads are
# created later by the main thread, so they serve at normal priority. Where the kernel groups
# sessions (autogroup: /proc/sys/kernel/sched_autogroup_enabled) and the role leads its own
# session (the local and SSH backends start it so), nice ranks the thread only against its
# own process's threads: the survivors then share the cores with it evenly (measured,
# docs/benchmark-history.md); the group's nice is left alone, as a starved import would only
# delay the rejoin.
LATE_JOIN_IMPORT_NICE = 10


def run_server(spec: TrainerSpec, role: str, index: int) -> None:
    """Start this role's server from the spec's cluster and block until the process ends.

    The cluster given to TensorFlow holds ps, worker and chief, so that every server knows
    every peer; the evaluator is not part of it.
    """
    late = not unreachable(spec.cluster.get(ROLE_CHIEF, [])[:1], timeout_s=0.5)
    if late:
        print(f"[{role}] joining a running job: TensorFlow imported at nice "
              f"{LATE_JOIN_IMPORT_NICE}", flush=True)
    server_lib, config_pb2 = at_nice(import_server_lib, LATE_JOIN_IMPORT_NICE if late else 0)
    assert role in (ROLE_PS, ROLE_WORKER), f"run_server: role must be ps or worker (got {role})"
    if index in spec.gpu_tasks.get(role, []):
        require_gpu(role, index)
    addresses = spec.cluster[role]
    assert 0 <= index < len(addresses), (
        f"--index {index}: cluster.{role} has {len(addresses)} entries")
    intra = (PS_INTRA_OP_THREADS if role == ROLE_PS
             else intra_op_threads(addresses, index, usable_cpus()))
    config = config_pb2.ConfigProto(inter_op_parallelism_threads=INTER_OP_THREADS,
                                    intra_op_parallelism_threads=intra)
    server = server_lib.Server(server_lib.ClusterSpec(spec.cluster), job_name=role,
                               task_index=index, protocol="grpc", config=config, start=True)
    events.emit(events.EVENT_READY, address=addresses[index])
    STARTUP.done("server")
    # Not server.join(): a main thread blocked inside that C++ call never runs Python signal
    # handlers, so SIGTERM would be ignored. The server's own threads do the serving.
    while server is not None:  # holding the reference keeps the server alive
        time.sleep(SIGNAL_POLL_S)


class NoGpuError(RuntimeError):
    """A task on a GPU host whose TensorFlow sees no GPU (it would train on the CPU)."""


def require_gpu(role: str, index: int) -> None:
    """Fail at once, in one line, when TensorFlow lists no GPU on a host that has one: the
    driver is missing or not loaded yet, or TensorFlow's CUDA libraries are not found. (The
    light import's `tensorflow.python.framework.config` is `tf.config`.)"""
    from tensorflow.python.framework import config as tf_config

    if not tf_config.list_physical_devices("GPU"):
        raise NoGpuError(
            f"{role} {index}: this host has a GPU but TensorFlow sees none (driver missing or "
            "not loaded, or CUDA libraries not found: check with nvidia-smi and python -c "
            "\"import tensorflow as tf; print(tf.config.list_physical_devices('GPU'))\"); "
            "it would train on the CPU")


def intra_op_threads(workers: list[str], index: int, cpus: int) -> int:
    """Kernel threads for worker `index`: this host's CPUs over the workers that share it
    (same host part in `workers`' host:port addresses), at least 1. On the local backend
    with 2 cores: 1 worker computes on 2 threads, 2 workers on 1 each."""
    host = workers[index].rpartition(":")[0]
    sharing = sum(1 for address in workers if address.rpartition(":")[0] == host)
    return max(1, cpus // sharing)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def lower_thread_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by `nice` (Linux: nice is per thread); not
    Linux, or not allowed: nothing changes."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def at_nice(load: Callable[[], Any], nice: int) -> Any:
    """`load()` (an import), in a thread lowered by `nice` when it is positive (the caller's
    own priority is unchanged); its result or its exception comes back to the caller."""
    if nice <= 0:
        return load()
    out: list[Any] = []
    failed: list[BaseException] = []

    def low_priority() -> None:
        lower_thread_priority(nice)
        try:
            out.append(load())
        except BaseException as ex:  # re-raised in the caller's thread
            failed.append(ex)

    worker = threading.Thread(target=low_priority, name="import-tensorflow")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return out[0]
