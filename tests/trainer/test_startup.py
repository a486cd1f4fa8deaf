"""Start-up cuts (trainer/startup.py, trainer/problems.py): what each role and the
orchestrator import, the digits split cache, and the `startup` event's wall and CPU phases.
Each import check runs in a fresh interpreter, so what it finds in `sys.modules` is what the
role would import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import free_ports

from trainer import events
from trainer.startup import Startup

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter of this venv; its last stdout line as JSON."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "TF_CPP_MIN_LOG_LEVEL": "3", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_server_serves_without_tensorflows_python_api() -> None:
    """A ps/worker enters TensorFlow through server_lib only: no tf.* API tree, no Keras,
    and a real gRPC server still comes up and accepts connections."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    found = run_python(f"""
import json, socket, sys
from trainer.startup import import_server_lib
server_lib, config_pb2 = import_server_lib()
server = server_lib.Server(server_lib.ClusterSpec({{"ps": ["{address}"]}}), job_name="ps",
                           task_index=0, protocol="grpc", start=True,
                           config=config_pb2.ConfigProto(inter_op_parallelism_threads=2))
host, port = "{address}".split(":")
socket.create_connection((host, int(port)), timeout=5).close()
print(json.dumps({{"api": "tensorflow.python.distribute.distribute_lib" in sys.modules,
                  "keras": "keras" in sys.modules, "data": "tensorflow.python.data" in sys.modules}}))
sys.stdout.flush()
import os; os._exit(0)
""")
    assert found == {"api": False, "keras": False, "data": False}, found


@pytest.mark.slow  # a full TensorFlow + Keras import: ~6 CPU s
def test_the_chief_import_skips_scikit_learn_but_can_still_import_it() -> None:
    found = run_python("""
import json, sys
from trainer.startup import import_tensorflow
tf = import_tensorflow()
skipped = "sklearn" not in sys.modules
import sklearn  # the skip is lifted once TensorFlow is in
print(json.dumps({"skipped": skipped, "tf": hasattr(tf, "distribute"),
                  "sklearn": sklearn.__name__}))
""")
    assert found == {"skipped": True, "tf": True, "sklearn": "sklearn"}, found


def test_digits_split_is_cached_and_identical(tmp_path: Path) -> None:
    """The first load splits with scikit-learn and caches; a fresh process then loads the
    same arrays without importing scikit-learn."""
    cache = str(tmp_path / "cache")
    code = """
import json, sys
import numpy as np
import pytest
from trainer.problems import load_digits
a = load_digits(None, 3)
np.savez("{out}", x=a.x_train, y=a.y_test)
print(json.dumps({{"sklearn": "sklearn" in sys.modules, "n": len(a.x_train)}}))
"""
    first = run_python(code.format(out=tmp_path / "first.npz"), TRANSIENT_DATA_CACHE=cache)
    second = run_python(code.format(out=tmp_path / "second.npz"), TRANSIENT_DATA_CACHE=cache)
    assert first == {"sklearn": True, "n": 1437} and second == {"sklearn": False, "n": 1437}
    with np.load(tmp_path / "first.npz") as a, np.load(tmp_path / "second.npz") as b:
        assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["y"], b["y"])
    assert list((tmp_path / "cache" / "digits").glob("split-seed3-sklearn*.npz"))


def test_startup_event_has_wall_and_cpu_per_phase(capsys) -> None:
    startup = Startup()
    startup.mark("import_tf")
    sum(i * i for i in range(300_000))  # some CPU in the next phase
    startup.done("model")
    startup.done("again")  # once per process
    lines = [ln for ln in capsys.readouterr().out.splitlines() if events.parse_event(ln)]
    assert len(lines) == 1
    event = events.parse_event(lines[0])
    assert event["kind"] == "startup"
    assert list(event["phases"]) == list(event["cpu_s"]) == ["import_tf", "model"]
    assert event["cpu_s"]["model"] > 0 and event["total_s"] >= event["phases"]["model"]


def test_worker_kernel_threads_share_the_host_among_its_workers() -> None:
    from trainer.server import intra_op_threads

    local = ["localhost:5001", "localhost:5002"]
    assert intra_op_threads(local, 0, cpus=2) == 1  # two workers on a 2-core host: 1 each
    assert intra_op_threads(local[:1], 0, cpus=2) == 2  # a lone worker uses both cores
    spread = ["10.0.0.2:2222", "10.0.0.3:2222", "10.0.0.3:2223"]
    assert intra_op_threads(spread, 0, cpus=16) == 16  # its own VM
    assert intra_op_threads(spread, 2, cpus=16) == 8
    assert intra_op_threads(spread, 1, cpus=1) == 1  # never 0


def test_the_orchestrators_registry_reads_import_no_numpy() -> None:
    """The orchestrator reads the problem registry (validation, the data step) before it
    starts the roles: numpy stays out of that critical path; a loader still has it."""
    found = run_python("""
import json, sys
from trainer import problems
needs = problems.get_problem("image_cifar10").requires_data_dir
before = "numpy" in sys.modules
arrays = problems.get_problem("synthetic").load(None, 0)
print(json.dumps({"needs": needs, "numpy": before, "shape": list(arrays.input_shape)}))
""")
    assert found == {"needs": True, "numpy": False, "shape": [32, 32, 3]}, found
