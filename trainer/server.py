"""The ps and worker roles: a gRPC `tf.distribute.Server` that serves until stopped."""

from __future__ import annotations

import time

from trainer import events
from trainer.spec import TrainerSpec
from trainer.startup import STARTUP, import_server_lib

# Small pools: on a 2-core host every role shares the same cores, and TF's default of one
# thread per core per pool in every process oversubscribes them badly.
INTER_OP_THREADS = 2
INTRA_OP_THREADS = 1
# The kernel may deliver SIGTERM to any of TF's threads; Python then runs the handler only
# when the main thread next executes bytecode. Short sleeps bound that delay.
SIGNAL_POLL_S = 0.2


def run_server(spec: TrainerSpec, role: str, index: int) -> None:
    """Start this role's server from the spec's cluster and block until the process ends.

    The cluster given to TensorFlow holds ps, worker and chief, so that every server knows
    every peer; the evaluator is not part of it.
    """
    server_lib, config_pb2 = import_server_lib()
    assert role in ("ps", "worker"), f"run_server: role must be ps or worker (got {role})"
    addresses = spec.cluster[role]
    assert 0 <= index < len(addresses), (
        f"--index {index}: cluster.{role} has {len(addresses)} entries")
    config = config_pb2.ConfigProto(inter_op_parallelism_threads=INTER_OP_THREADS,
                                    intra_op_parallelism_threads=INTRA_OP_THREADS)
    server = server_lib.Server(server_lib.ClusterSpec(spec.cluster), job_name=role,
                               task_index=index, protocol="grpc", config=config, start=True)
    events.emit("ready", address=addresses[index])
    STARTUP.done("server")
    # Not server.join(): a main thread blocked inside that C++ call never runs Python signal
    # handlers, so SIGTERM would be ignored. The server's own threads do the serving.
    while server is not None:  # holding the reference keeps the server alive
        time.sleep(SIGNAL_POLL_S)
