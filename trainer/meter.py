"""The chief's reporting: throttled `step` and `worker_steps` events, worker loss and rejoin.

- `step` `{"step", "loss", "steps_per_sec", "lr"}` at most every `report_every_s`.
- `worker_steps` `{"worker", "step_time_s", "steps"}` at the same time, one per worker seen in
  the sample: the mean on-worker step time (trainer/waits.py) over the steps of the last
  SAMPLE_CLOSURES finished closures since the previous report; `steps` counts those steps.
  Emitted by a fetcher thread, so it may trail its `step` event: a closure's result stays on
  its worker until fetched (see `Meter.observe`).
- `worker_failure` `{"worker", "error"}` when the coordinator logs a worker's failure, and
  `worker_rejoined` `{"worker"}` when it has re-created that worker's resources after the
  worker came back (same address, new process).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from trainer import events
from trainer.spec import TrainerSpec
from trainer.summaries import write_scalar
from trainer.waits import Membership, fetch_or_none

SAMPLE_CLOSURES = 64  # at most this many closure results are read per report
FETCH_WAIT_S = 1.0  # the first and the final report wait this long (twice) for their loss


class Meter:
    """Throttled `step` and `worker_steps` events and TensorBoard scalars.

    A step may run twice after a worker loss: rates come from the PS global step, which
    counts what was applied, not what was scheduled.
    """

    def __init__(self, spec: TrainerSpec, step: int, writer: Any,
                 lr_of: Callable[[int], float]) -> None:
        self.every_s = spec.report_every_s
        self.writer, self.lr_of = writer, lr_of
        self.last_time, self.last_step = time.time(), step
        self.sample: deque[Any] = deque(maxlen=max(SAMPLE_CLOSURES, 8 * spec.num_workers))
        self.last: Any = None
        self.loss: float | None = None  # the newest loss fetched
        self._jobs: queue.Queue[tuple[int, list[Any], Any]] = queue.Queue(maxsize=1)
        threading.Thread(target=self._fetcher, name="meter-fetch", daemon=True).start()

    def restart(self, step: int) -> None:
        self.last_time, self.last_step = time.time(), step
        self.sample.clear()

    def add(self, results: list[Any]) -> None:
        """Remember finished closures' RemoteValues `[loss, worker_id, step_time_s, steps]`."""
        if results:
            self.sample.extend(results)
            self.last = results[-1]

    def observe(self, read_step: Callable[[], int], results: list[Any],
                force: bool = False) -> None:
        """Emit `step` now (rate from the PS step counter) and hand the closure results to
        the fetcher thread, which emits `worker_steps`.

        A closure's result stays on its worker until fetched: a worker that hangs without
        dying (SIGSTOP) blocks a fetch until keepalive declares it lost. Fetching on the
        main thread stalled the whole run for that long; the fetcher only delays reports.
        `loss` is the newest fetched (the first report, and `force`, fetch here).
        """
        self.add(results)
        now = time.time()
        if not force and now - self.last_time < self.every_s:
            return
        step = read_step()
        rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
        job = (step, list(self.sample), self.last)
        self.sample.clear()
        if force or self.loss is None:
            self._fetch_here(job)
        else:
            with contextlib.suppress(queue.Full):  # busy on a hung worker: skip this sample
                self._jobs.put_nowait(job)
        lr = float(f"{self.lr_of(step):.6g}")  # the PS holds float32; drop its noise digits
        events.emit(events.EVENT_STEP, step=step, loss=self.loss, steps_per_sec=round(rate, 2),
                    lr=lr)
        with self.writer.as_default():
            write_scalar("steps_per_sec", rate, step)
            write_scalar("learning_rate", lr, step)
        self.last_time, self.last_step = now, step

    def _fetch_here(self, job: tuple[int, list[Any], Any]) -> None:
        """Fetch `job` before reporting it, but never wait on a hung worker: a result whose
        copy to the chief is still pending waits for its worker (trainer/waits.py
        `finished`). At most FETCH_WAIT_S for the fetcher to finish its job (so no report is
        emitted twice or late), then at most FETCH_WAIT_S for this one; past that the
        report goes out with the last loss known."""
        with self._jobs.all_tasks_done:
            self._jobs.all_tasks_done.wait_for(lambda: not self._jobs.unfinished_tasks,
                                               timeout=FETCH_WAIT_S)
        fetch = threading.Thread(target=self._fetch, args=job, name="meter-fetch-now",
                                 daemon=True)
        fetch.start()
        fetch.join(FETCH_WAIT_S)

    def _fetcher(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                self._fetch(*job)
            finally:
                self._jobs.task_done()

    def _fetch(self, step: int, sample: list[Any], last: Any) -> None:
        fetched = fetch_or_none(last) if last is not None else None
        if fetched is not None:
            self.loss = float(fetched[0])
            with self.writer.as_default():
                write_scalar("loss", self.loss, step)
        self._worker_steps(step, sample)

    def _worker_steps(self, step: int, sample: list[Any]) -> None:
        times: dict[int, list[float]] = {}  # worker -> [seconds, steps]
        for remote in sample:
            fetched = fetch_or_none(remote)  # None: computed on a worker that is gone now
            if fetched is None:
                continue
            _, worker, seconds, steps = fetched
            if steps <= 0:
                continue  # a closure that ran no step (a BSP group's late rerun)
            total = times.setdefault(int(worker), [0.0, 0.0])
            total[0] += float(seconds) * float(steps)
            total[1] += float(steps)
        for worker, (seconds, steps) in sorted(times.items()):
            mean = seconds / max(steps, 1.0)
            events.emit(events.EVENT_WORKER_STEPS, worker=worker, step_time_s=round(mean, 5),
                        steps=int(steps), step=step)
            with self.writer.as_default():
                write_scalar(f"worker_step_time_s/{worker}", mean, step)


class WorkerFailureEvents(logging.Handler):
    """Turn the coordinator's "Worker ... failed with ..." log record into a
    `worker_failure` event. The coordinator recovers by itself (it reschedules the closure
    and re-creates the worker's dataset when it returns); this makes the loss visible and
    tells `membership` (a BSP group held on the PS must end when one of its closures fails,
    also on a transient failure: "Remote function on worker ... failed with").
    """

    PATTERN = re.compile(r"/job:worker/replica:\d+/task:(\d+)")

    def __init__(self, membership: Membership | None = None) -> None:
        super().__init__()
        self.membership = membership

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        lost = message.startswith("Worker %s failed with")
        if not lost and not message.startswith("Remote function on worker %s failed with"):
            return
        device = str(record.args[0]) if record.args else ""
        match = self.PATTERN.search(device)
        worker = int(match.group(1)) if match else None
        if self.membership is not None:
            self.membership.failed(worker, lost)
        if lost:
            error = str(record.args[1]) if record.args and len(record.args) > 1 else ""
            events.emit(events.EVENT_WORKER_FAILURE, worker=device if worker is None else worker,
                        error=error[:300])


def watch_rejoins(coordinator: Any, membership: Membership | None = None) -> None:
    """Emit `worker_rejoined` when the coordinator recovers a worker. It calls the worker's
    `_on_worker_recovery` (private; looked up per failure, so wrapping the instance works)
    once the restarted worker answers; a no-op if those internals moved."""
    for worker in getattr(getattr(coordinator, "_cluster", None), "workers", []):
        original = getattr(worker, "_on_worker_recovery", None)
        if original is None:
            continue

        def recovered(original: Callable = original, index: int = worker.worker_index) -> None:
            original()
            if membership is not None:
                membership.rejoined(index)
            events.emit(events.EVENT_WORKER_REJOINED, worker=index)

        worker._on_worker_recovery = recovered
