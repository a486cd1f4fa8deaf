"""gRPC keepalive of every role's client channels, in agreement with the servers' ping policy,
and their reconnect backoff (a replaced peer is reached within CLIENT_RECONNECT's maximum).

TF's servers (`tf.distribute.Server`, trainer/server.py) build their gRPC server with no
channel arguments, and TF_GRPC_DEFAULT_OPTIONS reaches client channels only, so every server
keeps gRPC's server defaults: a ping that comes less than SERVER_MIN_PING_INTERVAL_MS after the
previous one, with no data sent by the server in between, is a strike, and the strike after
SERVER_MAX_PING_STRIKES is answered with GOAWAY "too_many_pings", which fails every call on the
connection. With 5 s keepalive pings, a call the server stayed silent on for ~15 s (a closure
of many steps on a loaded host: the chief waits for the worker's answer) drew that GOAWAY and a
healthy worker was failed (measured: a 40 s remote call failed after 15.6 s; with the values
below it returns). Light on purpose: trainer/__main__.py reads it before anything else.
"""

from __future__ import annotations

# The numbers:
# - keepalive_time_ms: the server's interval plus 30 s, because a BDP probe ping that follows
#   the server's last data frame may precede the first keepalive ping by up to that much;
#   never a strike, whatever the call's length.
# - keepalive_timeout_ms: gRPC's default; a vanished peer (no RST) fails its calls within
#   keepalive_time + timeout, about 6 min. Hung and vanished workers are named long before
#   by the chief's own heartbeat (trainer/heartbeat.py), and lost machines by the
#   orchestrator's poll: keepalive is only the last resort of a call that never returns.
# - keepalive_permit_without_calls=0: the servers allow a ping on a connection without calls
#   only every 2 h; pinging idle connections drew GOAWAYs too.
# - http2.max_pings_without_data=0: keep pinging during a long call (the default 2 would stop
#   checking it after two pings); the spacing above keeps each ping within the policy.
SERVER_MIN_PING_INTERVAL_MS = 300_000  # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS
SERVER_MAX_PING_STRIKES = 2  # GRPC_ARG_HTTP2_MAX_PING_STRIKES
SERVER_PERMITS_PINGS_WITHOUT_CALLS = False  # GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS
BDP_PING_MARGIN_MS = 30_000
CLIENT_KEEPALIVE: dict[str, int] = {
    "grpc.keepalive_time_ms": SERVER_MIN_PING_INTERVAL_MS + BDP_PING_MARGIN_MS,
    "grpc.keepalive_timeout_ms": 20_000,
    "grpc.keepalive_permit_without_calls": 0,
    "grpc.http2.max_pings_without_data": 0,
}
# A channel whose peer went away retries its connection on gRPC's backoff, which TF caps at
# 1 s: a replacement worker whose server was up waited for the chief's next try 0.4–1.1 s
# before it rejoined (issue 36, docs/benchmark-history.md; 0.23 and 0.29 s with these).
# Tries to a dead address are one refused or timed-out connect each (a timed-out one lasts
# gRPC's 20 s minimum connect timeout), so trying more often costs nearly nothing.
CLIENT_RECONNECT: dict[str, int] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 200,
}


def grpc_client_options() -> str:
    """CLIENT_KEEPALIVE and CLIENT_RECONNECT as TF_GRPC_DEFAULT_OPTIONS spells them
    (``name=value,...``), which TF reads once, when it creates its first channel: set it
    before TensorFlow is imported."""
    options = {**CLIENT_KEEPALIVE, **CLIENT_RECONNECT}
    return ",".join(f"{name}={value}" for name, value in options.items())
