"""The chief's dispatch capacity: how many global steps per second one chief can feed.

Every ASP global step is (at one step per closure) one closure the chief schedules and one
round of RPCs to the parameter server. With a model whose step costs next to nothing, the
global step rate the cluster reaches is the chief's ceiling: a real cluster of N workers
with step time t needs N / t steps/s, so the largest cluster one chief can feed at step time
t is about rate × t workers. Measured here for 1, 2, 4 and 8 local workers, with one step
per closure and with several (`job.steps_per_closure`), through the trainer's own ASP runner
(trainer/asp.py).

Each worker count runs in its own process (`python -m bench.dispatch WORKERS`): one PS and
the workers are in-process `tf.distribute.Server`s of that process, the chief is its main
thread. `section()` starts those processes and formats their JSON lines.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from provisioning.checkout import PROJECT_ROOT as ROOT

WORKER_COUNTS = (1, 2, 4, 8)
MANY = 16  # steps per closure of the "several" variant
REPEATS = 3
MEASURE_S = 3.0  # seconds per measurement
STEP_TIMES_MS = (5, 20, 50, 200)  # step times at which the reading is given


def measure(workers: int) -> dict[str, Any]:
    """In this process: a 1-PS cluster of `workers` in-process workers; steps/s for one and
    MANY steps per closure, REPEATS times each."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from provisioning.local import reserve_port
    from trainer.asp import AspRunner
    from trainer.layout import ROLE_CHIEF, ROLE_PS, ROLE_WORKER

    # in-process servers share this process's inter-op pool; a worker's function blocks a
    # thread on its PS RPC, so a pool as small as the core count deadlocks them
    threads = 4 * workers + 8
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    ports = [f"127.0.0.1:{reserve_port()}" for _ in range(workers + 2)]
    cluster = tf.train.ClusterSpec({ROLE_PS: ports[:1], ROLE_WORKER: ports[1:workers + 1],
                                    ROLE_CHIEF: ports[workers + 1:]})
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc",
                                    config=config, start=True)
               for job in (ROLE_PS, ROLE_WORKER) for i in range(len(cluster.as_dict()[job]))]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type=ROLE_CHIEF, task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        weight = tf.Variable(0.0)
        global_step = tf.Variable(0, dtype=tf.int64)
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensors(1.0).repeat()))

    def steps_of(iterator: Any, worker_id: Any, loop: Any, steps: Any) -> Any:
        # steps that cost next to nothing: one input element, one update, one count each;
        # `loop` a tf.range (a graph loop) or a Python range (unrolled)
        for _ in loop:
            weight.assign_add(next(iterator) * 1e-6)
            global_step.assign_add(1)
        return tf.stack([tf.constant(0.0, tf.float64), tf.cast(worker_id, tf.float64),
                         tf.constant(0.0, tf.float64), tf.cast(steps, tf.float64)])

    @tf.function
    def step(iterator: Any, worker_id: Any, steps: Any) -> Any:
        return steps_of(iterator, worker_id, tf.range(steps), steps)

    def unrolled(k: int) -> Any:
        # the same K steps without the loop, as the trainer's full closures run
        @tf.function
        def step_k(iterator: Any, worker_id: Any) -> Any:
            return steps_of(iterator, worker_id, range(k), k)
        return step_k

    worker_id = tf.constant(0, tf.int32)
    rates: dict[str, list[float]] = {}
    for mode in ("1", str(MANY), f"{MANY}u"):
        k = int(mode.rstrip("u"))
        run = AspRunner(coordinator, step, (iterator, worker_id), workers, k,
                         unrolled=unrolled if mode.endswith("u") else None)
        run.warm()  # traces the step (and, unrolled, the K-step closure) before the clock
        run(4 * k * workers)  # warm up
        run.drain()
        for _ in range(REPEATS):
            before, started = int(global_step.numpy()), time.perf_counter()
            while time.perf_counter() - started < MEASURE_S:
                run(1_000_000)  # one chunk per call; never the end of a stretch
            run.drain()
            elapsed = time.perf_counter() - started
            rates.setdefault(mode, []).append((int(global_step.numpy()) - before) / elapsed)
    del servers
    return {"workers": workers, "rates": rates}


def _stats(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def section() -> list[str]:
    """Measure now (one process per worker count) and return the markdown section."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    results = []
    for workers in WORKER_COUNTS:
        proc = subprocess.run([sys.executable, "-m", "bench.dispatch", str(workers)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"dispatch bench with {workers} workers failed "
                               f"({proc.returncode}):\n{proc.stderr[-2000:]}")
        results.append(json.loads(lines[-1]))
    out = [
        "## Chief dispatch capacity",
        "",
        "Global steps per second one chief sustains on a step that costs next to nothing "
        "(one scalar update on the PS), through the trainer's ASP runner, with one step per "
        f"closure (the baseline) and with {MANY} (`job.steps_per_closure`), looped in the "
        "closure and unrolled (as the trainer runs full closures). One PS and the "
        "workers are in-process servers of the measuring process, so on this machine they "
        f"share its cores with the chief. {REPEATS} repeats of {MEASURE_S:.0f} s each.",
        "",
        "| workers | 1 step/closure: min / median / max steps/s | "
        f"{MANY} looped | {MANY} unrolled | ratios to 1 step/closure (medians) |",
        "|---|---|---|---|---|",
    ]
    medians = {}
    for r in results:
        one, loop = _stats(r["rates"]["1"]), _stats(r["rates"][str(MANY)])
        many = _stats(r["rates"][f"{MANY}u"])
        medians[r["workers"]] = (one[1], many[1])
        out.append(f"| {r['workers']} | {one[0]:.0f} / {one[1]:.0f} / {one[2]:.0f} | "
                   f"{loop[0]:.0f} / {loop[1]:.0f} / {loop[2]:.0f} | "
                   f"{many[0]:.0f} / {many[1]:.0f} / {many[2]:.0f} | "
                   f"{loop[1] / one[1]:.1f}× looped, {many[1] / one[1]:.1f}× unrolled |")
    best_one = max(m[0] for m in medians.values())
    best_many = max(m[1] for m in medians.values())
    out += [
        "",
        "Reading: a cluster of N workers whose step takes t seconds asks for N / t global "
        "steps/s, so one chief can feed about (best rate above) × t workers. The largest "
        "cluster one chief can feed, from the best median rate:",
        "",
        "| step time | 1 step/closure | " + f"{MANY} steps/closure (unrolled) |",
        "|---|---|---|",
    ]
    for ms in STEP_TIMES_MS:
        out.append(f"| {ms} ms | {int(best_one * ms / 1000)} workers | "
                   f"{int(best_many * ms / 1000)} workers |")
    out += ["", "With several steps per closure the chief's cost per global step drops by "
            "about the factor in the first table; the automatic default "
            "(`steps_per_closure: 0`) picks K so that a closure lasts about 50 ms.", ""]
    return out


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads would hold a normal exit
