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

The parameter servers get the same heartbeat (`job="ps"`): `ps_unresponsive` `{"ps",
"silent_s"}` and `ps_responsive` `{"ps", "silent_s"}`. A frozen PS stalls every worker at once
(their steps read and write its variables) and refuses nothing, so without these the stall
left no event and the workers' inflated step times afterwards looked like a straggler; the
orchestrator holds straggler detection while a PS is silent (orchestrator/runtime/supervisor.py).

Its own channel, not TensorFlow's: a remote eager op issued from a second thread of the
chief corrupted the coordinator's requests ("Unable to parse request").
"""

from __future__ import annotations

import threading
import time

from trainer import events
from trainer.layout import ROLE_PS, ROLE_WORKER

HEARTBEAT_S = 1.0
UNRESPONSIVE_S = 4.0
STATUS_RPC = "/tensorflow.WorkerService/GetStatus"  # empty request = valid GetStatusRequest

_silent: set[int] = set()  # worker indices silent now (set operations are atomic)
_silent_ps: set[int] = set()  # parameter-server indices silent now


def unresponsive() -> frozenset[int]:
    """The workers whose last heartbeat passed its deadline (empty before any heartbeat)."""
    return frozenset(_silent)


def unresponsive_ps() -> frozenset[int]:
    """The parameter servers whose last heartbeat passed its deadline."""
    return frozenset(_silent_ps)


def start_heartbeats(addresses: list[str], period_s: float = HEARTBEAT_S,
                     unresponsive_s: float = UNRESPONSIVE_S,
                     job: str = ROLE_WORKER) -> threading.Event:
    """One daemon thread per address of `job` ("worker" or "ps"; index = position in the
    cluster spec); they stop after their current beat once the returned event is set."""
    import grpc

    stop = threading.Event()
    silent_now = _silent_ps if job == ROLE_PS else _silent
    went_silent, answers = (
        (events.EVENT_PS_UNRESPONSIVE, events.EVENT_PS_RESPONSIVE) if job == ROLE_PS
        else (events.EVENT_WORKER_UNRESPONSIVE, events.EVENT_WORKER_RESPONSIVE))

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
                silent_now.add(index)
                events.emit(went_silent, **{job: index},
                            silent_s=round(time.time() - started, 1))
            elif not hung and silent_since is not None:
                silent_now.discard(index)
                if answered:
                    events.emit(answers, **{job: index},
                                silent_s=round(time.time() - silent_since, 1))
                silent_since = None
            stop.wait(max(0.0, period_s - (time.time() - started)))
        silent_now.discard(index)

    for index, address in enumerate(addresses):
        threading.Thread(target=beat, args=(index, address), name=f"heartbeat-{job}{index}",
                         daemon=True).start()
    return stop
