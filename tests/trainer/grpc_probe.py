"""A TensorFlow server, or a client that runs one long remote call on it (tests/trainer/
test_keepalive.py): the call is a tf.function sleeping on the server's device, during which
the server sends nothing on the connection, as a worker running a long closure does.

    python grpc_probe.py server CLUSTER_JSON          # job "worker", task 0; prints "ready"
    python grpc_probe.py client CLUSTER_JSON SECONDS  # prints "ok S" or "failed S: ERROR"

The client takes its gRPC keepalive from TF_GRPC_DEFAULT_OPTIONS, as every trainer role does.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    import tensorflow as tf

    role, cluster = sys.argv[1], tf.train.ClusterSpec(json.loads(sys.argv[2]))
    if role == "server":
        server = tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc")
        print("ready", flush=True)
        while server is not None:
            time.sleep(1)
    from trainer.tfcompat import sleep

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type="chief", task_id=0, rpc_layer="grpc")
    tf.config.experimental_connect_to_cluster(resolver, job_name="chief",
                                              make_master_device_default=False)
    seconds = float(sys.argv[3])

    @tf.function
    def silent_call() -> tf.Tensor:
        return sleep(tf.constant(seconds, tf.float64))

    started = time.monotonic()
    try:
        with tf.device("/job:worker/replica:0/task:0"):
            silent_call().numpy()
        print(f"ok {time.monotonic() - started:.1f}", flush=True)
    except Exception as error:  # reported to the test
        print(f"failed {time.monotonic() - started:.1f}: {type(error).__name__}: "
              f"{' '.join(str(error).split())[:200]}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # TF's gRPC threads would otherwise hold the process


if __name__ == "__main__":
    main()
