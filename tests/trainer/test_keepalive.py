"""gRPC keepalive that TF's servers accept: the clients' pings never break the servers' ping
policy (gRPC's defaults, which TF's servers keep), so a long call on a healthy worker is not
failed with GOAWAY "too_many_pings" (trainer/keepalive.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import keepalive

PROBE = Path(__file__).with_name("grpc_probe.py")
REPO = Path(__file__).resolve().parents[2]
# A call the server is silent on for this long drew the GOAWAY with 5 s keepalive pings
# (after 15.6 s; measured with the same probe)
SILENT_CALL_S = 25.0


def test_the_clients_keepalive_agrees_with_the_servers_ping_policy() -> None:
    options = dict(item.split("=") for item in keepalive.grpc_client_options().split(","))
    interval = int(options["grpc.keepalive_time_ms"])
    # every keepalive ping comes after the server's minimum interval, even after a BDP ping
    # that followed the server's last data: never a strike, so never the GOAWAY
    assert interval - keepalive.BDP_PING_MARGIN_MS >= keepalive.SERVER_MIN_PING_INTERVAL_MS
    # idle connections are not pinged: the servers do not permit it (every 2 h at most)
    assert not keepalive.SERVER_PERMITS_PINGS_WITHOUT_CALLS
    assert options["grpc.keepalive_permit_without_calls"] == "0"
    # a long call keeps being checked (a vanished peer still fails it, minutes later)
    assert options["grpc.http2.max_pings_without_data"] == "0"
    assert int(options["grpc.keepalive_timeout_ms"]) > 0
    assert interval + int(options["grpc.keepalive_timeout_ms"]) < 10 * 60_000


def test_every_role_sets_these_options_before_tensorflow_starts() -> None:
    from trainer import __main__ as trainer_main

    assert keepalive.grpc_client_options() == trainer_main.GRPC_KEEPALIVE


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_a_long_silent_call_on_a_tensorflow_server_is_not_failed_by_its_ping_policy(
        tmp_path: Path) -> None:
    from trainer_harness import free_ports

    ports = free_ports(2)
    cluster = json.dumps({"worker": [f"127.0.0.1:{ports[0]}"],
                          "chief": [f"127.0.0.1:{ports[1]}"]})
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_GRPC_DEFAULT_OPTIONS": keepalive.grpc_client_options()}
    server = subprocess.Popen([sys.executable, str(PROBE), "server", cluster], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = subprocess.run([sys.executable, str(PROBE), "client", cluster,
                                 str(SILENT_CALL_S)], env=env, capture_output=True, text=True,
                                timeout=300)
    finally:
        server.kill()
        server.wait()
    said = [ln for ln in client.stdout.splitlines() if ln.startswith(("ok", "failed"))]
    assert said and said[0].startswith("ok "), client.stdout + client.stderr[-2000:]
    assert "too_many_pings" not in client.stderr, client.stderr[-2000:]


def test_a_restarted_peer_is_retried_sooner_than_tensorflows_one_second() -> None:
    options = dict(item.split("=") for item in keepalive.grpc_client_options().split(","))
    initial = int(options["grpc.initial_reconnect_backoff_ms"])
    most = int(options["grpc.max_reconnect_backoff_ms"])
    # TF caps the backoff at 1 s; a replacement at the same address waited up to that long
    assert 0 < initial <= most < 1000
    # the connect timeout (grpc.min_reconnect_backoff_ms) keeps gRPC's 20 s: a slow link's
    # connect is not cut short
    assert "grpc.min_reconnect_backoff_ms" not in options
