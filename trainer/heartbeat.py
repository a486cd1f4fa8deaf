"""The chief's heartbeat to every worker: names a worker that hangs without dying.

A worker that stops answering (SIGSTOP, a frozen host) keeps its TCP connections open, so
nothing fails fast; the coordinator only learns of it through gRPC keepalive, which TF's
servers undermine (they take no channel arguments, keep gRPC's server ping policy and answer
frequent pings with `GOAWAY too_many_pings`, which doubles the client's keepalive time).
Every HEARTBEAT_S the chief calls the worker's cheapest RPC (`WorkerService/GetStatus`) on
its own gRPC channel, with a deadline of UNRESPONSIVE_S; when the deadline passes,
`worker_unresponsive` `{"worker", "silent_s"}` names the worker (once per episode), and
`worker_responsive` `{"worker", "silent_s"}` says when it answers again (SIGCONT, a host
that thawed). A worker that refuses connections is lost, not hung: the coordinator reports
that (`worker_failure`). `unresponsive()` is the set of workers silent now: the chief's
drains do not wait for the closures they hold (trainer/waits.py).

Its own channel, not TensorFlow's: a remote eager op issued from a second thread of the
chief corrupted the coordinator's requests ("Unable to parse request").
"""

from __future__ import annotations

import threading
import time

from trainer import events

HEARTBEAT_S = 1.0
UNRESPONSIVE_S = 4.0
STATUS_RPC = "/tensorflow.WorkerService/GetStatus"  # empty request = valid GetStatusRequest

_silent: set[int] = set()  # worker indices silent now (set operations are atomic)


def unresponsive() -> frozenset[int]:
    """The workers whose last heartbeat passed its deadline (empty before any heartbeat)."""
    return frozenset(_silent)


def start_heartbeats(addresses: list[str], period_s: float = HEARTBEAT_S,
                     unresponsive_s: float = UNRESPONSIVE_S) -> threading.Event:
    """One daemon thread per worker address (index = position in the cluster spec); they
    stop after their current beat once the returned event is set."""
    import grpc

    stop = threading.Event()

    def beat(index: int, address: str) -> None:
        status = grpc.insecure_channel(address).unary_unary(STATUS_RPC)
        silent_since: float | None = None
        while not stop.is_set():
            started = time.time()
            try:
                status(b"", timeout=unresponsive_s)
                answered, hung = True, False
            except grpc.RpcError as exc:
                # refused or restarting: lost, not hung (the coordinator reports it)
                answered, hung = False, exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if hung and silent_since is None:
                silent_since = started
                _silent.add(index)
                events.emit("worker_unresponsive", worker=index,
                            silent_s=round(time.time() - started, 1))
            elif not hung and silent_since is not None:
                _silent.discard(index)
                if answered:
                    events.emit("worker_responsive", worker=index,
                                silent_s=round(time.time() - silent_since, 1))
                silent_since = None
            stop.wait(max(0.0, period_s - (time.time() - started)))
        _silent.discard(index)

    for index, address in enumerate(addresses):
        threading.Thread(target=beat, args=(index, address), name=f"heartbeat-{index}",
                         daemon=True).start()
    return stop
