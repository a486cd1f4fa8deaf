"""The ps and worker roles: a gRPC `tf.distribute.Server` that serves until stopped."""

from __future__ import annotations

import sys
import time

from trainer import events
from trainer.spec import TrainerSpec
from trainer.startup import STARTUP

# Small pools: on a 2-core host every role shares the same cores, and TF's default of one
# thread per core per pool in every process oversubscribes them badly.
INTER_OP_THREADS = 2
INTRA_OP_THREADS = 1
# The kernel may deliver SIGTERM to any of TF's threads; Python then runs the handler only
# when the main thread next executes bytecode. Short sleeps bound that delay.
SIGNAL_POLL_S = 0.2
# `import tensorflow` ends by importing Keras eagerly (for its SavedModel registrations), and
# Keras pulls in scikit-learn, SciPy and pandas: about half of the import's CPU time. A
# server only runs the functions the chief sends it, so it never needs Keras; TF catches the
# ImportError this entry causes. Measured: 8.3 -> 4.4 CPU s per server process.
SKIPPED_AT_IMPORT = "keras.src.optimizers"


def run_server(spec: TrainerSpec, role: str, index: int) -> None:
    """Start this role's server from the spec's cluster and block until the process ends.

    The cluster given to TensorFlow holds ps, worker and chief, so that every server knows
    every peer; the evaluator is not part of it.
    """
    sys.modules.setdefault(SKIPPED_AT_IMPORT, None)  # type: ignore[arg-type]
    import tensorflow as tf

    STARTUP.mark("import_tf")
    assert role in ("ps", "worker"), f"run_server: role must be ps or worker (got {role})"
    addresses = spec.cluster[role]
    assert 0 <= index < len(addresses), (
        f"--index {index}: cluster.{role} has {len(addresses)} entries")
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=INTER_OP_THREADS,
                                      intra_op_parallelism_threads=INTRA_OP_THREADS)
    server = tf.distribute.Server(tf.train.ClusterSpec(spec.cluster), job_name=role,
                                  task_index=index, protocol="grpc", config=config, start=True)
    events.emit("ready", address=addresses[index])
    STARTUP.done("server")
    # Not server.join(): a main thread blocked inside that C++ call never runs Python signal
    # handlers, so SIGTERM would be ignored. The server's own threads do the serving.
    while server is not None:  # holding the reference keeps the server alive
        time.sleep(SIGNAL_POLL_S)
