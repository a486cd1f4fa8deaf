"""The chief's heartbeat against a real gRPC server on loopback that answers, hangs, and
answers again (the WorkerService/GetStatus method a TensorFlow server serves)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from trainer import heartbeat
from trainer.events import parse_event


class StatusServer:
    """GetStatus answered at once, or held (like a SIGSTOPped worker) while `hung` is set."""

    def __init__(self) -> None:
        self.hung = threading.Event()
        self.released = threading.Event()

        def get_status(request: bytes, context: grpc.ServicerContext) -> bytes:
            if self.hung.is_set():
                self.released.wait(5)  # past the caller's deadline: it sees a hung peer
            return b""

        handler = grpc.method_handlers_generic_handler("tensorflow.WorkerService", {
            "GetStatus": grpc.unary_unary_rpc_method_handler(get_status)})
        from concurrent.futures import ThreadPoolExecutor

        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.released.set()
        self.server.stop(0)


@pytest.fixture
def server() -> Iterator[StatusServer]:
    s = StatusServer()
    yield s
    s.stop()


def events_of(text: str, kind: str) -> list[dict]:
    return [e for e in map(parse_event, text.splitlines()) if e and e["kind"] == kind]


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


def test_a_hung_worker_is_named_and_its_return_too(server: StatusServer,
                                                   capsys: pytest.CaptureFixture) -> None:
    stop = heartbeat.start_heartbeats([f"127.0.0.1:{server.port}"], period_s=0.1,
                                      unresponsive_s=0.3)
    try:
        time.sleep(0.5)  # answering: nothing to report
        assert heartbeat.unresponsive() == frozenset()
        server.hung.set()
        wait_until(lambda: heartbeat.unresponsive() == {0})
        server.hung.clear()
        server.released.set()
        wait_until(lambda: heartbeat.unresponsive() == frozenset())
        time.sleep(0.1)
    finally:
        stop.set()
    out = capsys.readouterr().out
    silent = events_of(out, "worker_unresponsive")
    back = events_of(out, "worker_responsive")
    assert [e["worker"] for e in silent] == [0]  # once per episode, not once per beat
    assert [e["worker"] for e in back] == [0] and back[0]["silent_s"] >= 0.3, back


def test_a_refusing_worker_is_lost_not_hung(capsys: pytest.CaptureFixture) -> None:
    """A closed port is the coordinator's business (`worker_failure`), not the heartbeat's."""
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop = heartbeat.start_heartbeats([f"127.0.0.1:{port}"], period_s=0.05,
                                      unresponsive_s=0.3)
    time.sleep(0.5)
    stop.set()
    assert heartbeat.unresponsive() == frozenset()
    assert not events_of(capsys.readouterr().out, "worker_unresponsive")


def test_a_frozen_parameter_server_is_named_apart_from_the_workers(
        server: StatusServer, capsys: pytest.CaptureFixture) -> None:
    """A PS that stops answering (SIGSTOP) is `ps_unresponsive`, its return `ps_responsive`
    with how long it was silent; the workers' set (what the chief's drains skip) is untouched."""
    stop = heartbeat.start_heartbeats([f"127.0.0.1:{server.port}"], period_s=0.1,
                                      unresponsive_s=0.3, job="ps")
    try:
        server.hung.set()
        wait_until(lambda: heartbeat.unresponsive_ps() == {0})
        assert heartbeat.unresponsive() == frozenset()
        server.hung.clear()
        server.released.set()
        wait_until(lambda: heartbeat.unresponsive_ps() == frozenset())
        time.sleep(0.1)
    finally:
        stop.set()
    out = capsys.readouterr().out
    assert [e["ps"] for e in events_of(out, "ps_unresponsive")] == [0]
    back = events_of(out, "ps_responsive")
    assert [e["ps"] for e in back] == [0] and back[0]["silent_s"] >= 0.3, back
    assert not events_of(out, "worker_unresponsive")
