"""The chief's heartbeat to every worker: keeps gRPC keepalive honest, names a hung worker.

Two problems, one cure:

- TF's gRPC servers take no channel arguments, so they keep gRPC's server ping policy: a
  keepalive ping on a connection over which the server has sent nothing since the last one
  is a strike, and the third draws `GOAWAY too_many_pings`, after which the client doubles
  its keepalive time. The chief's stream to a worker stays open while the worker idles
  (start-up, checkpoints, evaluations, BSP barriers), so detection of a hung worker drifted
  from ~10 s to a minute or more. A tiny op on each worker every HEARTBEAT_S makes the
  server send data, which clears the strikes: the 5 s keepalive keeps its meaning.
- A worker that hangs without dying (SIGSTOP, a frozen host) answers nothing. When a beat
  has waited UNRESPONSIVE_S, `worker_unresponsive` `{"worker", "silent_s"}` names it, well
  before the coordinator's own `worker_failure` (keepalive: ping 5 s + timeout 5 s).

Each worker has its own daemon thread (a beat to a hung worker blocks its thread only).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from trainer import events

HEARTBEAT_S = 1.0
UNRESPONSIVE_S = 4.0


def start_heartbeats(tf: Any, workers: int, period_s: float = HEARTBEAT_S,
                     unresponsive_s: float = UNRESPONSIVE_S) -> None:
    """Start one beat thread per worker and one watcher (all daemons)."""
    sent_at: list[float | None] = [None] * workers  # a beat in flight since then
    reported = [False] * workers

    def beat(index: int) -> None:
        device = f"/job:worker/replica:0/task:{index}/device:CPU:0"
        while True:
            sent_at[index] = time.time()
            try:
                with tf.device(device):
                    tf.identity(tf.constant(index)).numpy()  # one round trip to the worker
            except Exception:  # lost or restarting: the coordinator reports that
                time.sleep(period_s)
            sent_at[index] = None
            reported[index] = False
            time.sleep(period_s)

    def watch() -> None:
        while True:
            time.sleep(period_s / 2)
            now = time.time()
            for index, since in enumerate(sent_at):
                if since is not None and now - since > unresponsive_s and not reported[index]:
                    reported[index] = True
                    events.emit("worker_unresponsive", worker=index,
                                silent_s=round(now - since, 1))

    for index in range(workers):
        threading.Thread(target=beat, args=(index,), name=f"heartbeat-{index}",
                         daemon=True).start()
    threading.Thread(target=watch, name="heartbeat-watch", daemon=True).start()
