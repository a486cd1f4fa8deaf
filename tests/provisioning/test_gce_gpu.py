"""A GPU VM that sees no GPU fails fast (audit row 13): the startup script publishes what
nvidia-smi sees as a guest attribute, and the provider stops the acquire with one line instead
of letting the trainer run on the CPU. The script's bash runs for real against the fake's
metadata server with a stand-in nvidia-smi. Past the driver, TensorFlow itself must see the
GPU: the trainer spec lists the GPU hosts' tasks (`gpu_tasks`), whose server fails at start
with one line when `tf.config.list_physical_devices('GPU')` is empty."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.plan import make_plan
from orchestrator.runtime.run import build_trainer_spec
from orchestrator.validate import compose_experiment
from provisioning.base import BadRequestError, Cluster, Host
from provisioning.gce.body import GPU_NAMESPACE, gpu_check_script
from provisioning.gce.config import GceConfig
from provisioning.gce.provider import GceProvider
from provisioning.local import LocalProvider
from tests.fakes.gce_server import NO_DRIVER, FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    ZONES,
    fake_fixture,
    make_provider_fixture,
    small_request,
)
from trainer.events import parse_event
from trainer.spec import JobSpec, PhaseSpec, TrainerSpec


def test_a_gpu_vm_without_a_driver_stops_the_acquire_in_one_line(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.gpu_driver_ok = False
    provider = make_provider()
    with pytest.raises(BadRequestError) as info:
        provider.acquire(small_request("nogpu", tmp_path, workers=1))
    message = str(info.value)
    assert "\n" not in message
    assert "(n1-standard-4, GPU t4) sees no GPU: nvidia-smi: NVIDIA-SMI has failed" in message
    assert "driver is missing or not loaded" in message
    assert fake.live_instances() == []


def test_the_gpu_check_can_be_turned_off(fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.gpu_driver_ok = False
    provider = make_provider(gpu_check=False)
    cluster = provider.acquire(small_request("nocheck", tmp_path, workers=1))
    try:
        worker = next(i for i in fake.live_instances() if i.body["labels"]["role"] == "worker")
        items = {i["key"]: i["value"] for i in worker.body["metadata"]["items"]}
        assert "transient-gpu-check" not in items["startup-script"]
    finally:
        provider.release(cluster)


@pytest.mark.skipif(shutil.which("curl") is None,
                    reason="GPU CHECK SCRIPT NOT RUN: the VM-side script uses curl, missing here")
@pytest.mark.parametrize(("smi", "expected"), [
    ("echo 'GPU 0: Tesla T4 (UUID: GPU-1234)'", "1"),
    (f'echo "{NO_DRIVER}"; exit 9', f"0: {NO_DRIVER}"),
])
def test_the_vm_side_check_publishes_what_nvidia_smi_sees(fake: FakeGce, tmp_path: Path,
                                                          smi: str, expected: str) -> None:
    zone = ZONES[0]
    fake.insert(zone, {"name": "vm-1", "metadata": {"items": [
        {"key": "enable-guest-attributes", "value": "TRUE"}]}}, None)
    vm = fake.instances[(zone, "vm-1")]
    vm.host_keys = [("ssh-ed25519", "AAAA")]
    while vm.status(time.time(), fake.stop_s) != "RUNNING":  # a guest runs once booted
        time.sleep(0.02)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{smi}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    script = tmp_path / "gpu.sh"
    script.write_text(gpu_check_script(wait_s=0))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin",
           "TRANSIENT_METADATA_URL": fake.metadata_url(zone, "vm-1")}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    [(key, value)] = [(i["key"], i["value"]) for i in fake.guest_attributes(
        zone, "vm-1", f"{GPU_NAMESPACE}/")["queryValue"]["items"]]
    assert (key, value.strip()) == ("gpus", expected.strip())


def test_the_spec_lists_the_gpu_hosts_tasks_where_the_backend_provides_gpus() -> None:
    cfg = compose_experiment("cifar10_res32", ["cluster.workers=3"])
    plan = make_plan(cfg)
    cluster = Cluster("r", [Host(f"h{i}", spec, f"10.0.0.{i}", 2222, Path("/w"))
                            for i, spec in enumerate(plan.host_specs())])
    assert GceProvider(GceConfig(), api=object()).gpus_checked
    spec = build_trainer_spec(cfg, plan, cluster, "r", gpus_checked=True)
    assert spec.gpu_tasks == {"worker": [0, 1, 2]}  # T4 workers; the PS has no GPU
    assert TrainerSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert not GceProvider(GceConfig(gpu_check=False), api=object()).gpus_checked
    assert not LocalProvider.gpus_checked  # GPUs stood in for by CPU processes
    assert build_trainer_spec(cfg, plan, cluster, "r").gpu_tasks == {}


def test_a_gpu_task_whose_tensorflow_sees_no_gpu_fails_at_start_in_one_line(
        tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES="" hides any GPU from TensorFlow, as a driver it cannot use does."""
    spec = TrainerSpec(run_id="nogpu", cluster={"ps": ["127.0.0.1:1"], "worker":
                                                ["127.0.0.1:2"], "chief": ["127.0.0.1:3"]},
                       job=JobSpec(train_steps=10),
                       phases=[PhaseSpec("asp", 10)], run_dir=str(tmp_path),
                       gpu_tasks={"worker": [0]})
    path = spec.to_json(tmp_path / "spec.json")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "trainer", "--role", "worker", "--index", "0",
                           "--spec", str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(repo),
                                            "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1, proc.stderr[-2000:]
    events = [e for e in map(parse_event, proc.stdout.splitlines()) if e]
    failure = next(e for e in events if e["kind"] == "failure")
    assert failure["error"].startswith("NoGpuError: worker 0: this host has a GPU but "
                                       "TensorFlow sees none (driver missing or not loaded")
    assert "\n" not in failure["error"]
    assert not any(e["kind"] == "ready" for e in events)  # it never served
