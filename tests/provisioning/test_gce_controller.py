"""The controller VM of a detached sweep (provisioning/gce/controller.py): its body and its
startup script. The VM booting and installing the tool is tested on the fake cloud's isolated
VMs (tests/provisioning/test_gce_detach.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provisioning.gce import controller
from provisioning.gce.body import LEASE_KEY, LEASE_S_KEY
from provisioning.gce.config import GceConfig

SWEEP = "gs://lab-bucket/runs/sweeps/cifar10-res32-20261128-221500-3fa2"


def body(**cfg: object) -> dict:
    config = GceConfig(project="p", zones=["us-west1-a"], **cfg)  # type: ignore[arg-type]
    return controller.controller_body(config, "p", "us-west1-a", "tc-x", SWEEP, None,
                                      {"STORAGE_EMULATOR_HOST": "http://10.0.0.1:9"}, 7200)


def test_the_controller_is_an_on_demand_leased_vm_with_its_own_account() -> None:
    made = body()
    assert made["machineType"].endswith("/e2-standard-2")
    assert "guestAccelerators" not in made
    scheduling = made["scheduling"]
    assert "provisioningModel" not in scheduling  # on-demand: never SPOT
    assert scheduling["maxRunDuration"] == {"seconds": "7200"}
    assert scheduling["instanceTerminationAction"] == "DELETE"
    labels = made["labels"]
    assert labels["role"] == "controller" and labels["tool"] == "transient-ps"
    assert labels["sweep-id"] == "cifar10-res32-20261128-221500-3fa2"
    account = made["serviceAccounts"][0]
    assert account["email"] == "default"
    assert account["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    items = {i["key"]: i["value"] for i in made["metadata"]["items"]}
    assert items[controller.SWEEP_KEY] == SWEEP
    assert "STORAGE_EMULATOR_HOST" in items[controller.ENV_KEY]
    assert "ssh-keys" not in items  # no key of the user's
    assert LEASE_KEY in items and items[LEASE_S_KEY] == "900"
    assert "transient-lease-watcher" in items["startup-script"]
    named = body(service_account="ctl@p.iam.gserviceaccount.com", lease_s=0,
                 controller_machine_type="e2-standard-4")
    assert named["serviceAccounts"][0]["email"] == "ctl@p.iam.gserviceaccount.com"
    assert named["machineType"].endswith("/e2-standard-4")
    keys = {i["key"] for i in named["metadata"]["items"]}
    assert LEASE_KEY not in keys


def test_the_startup_script_is_valid_bash_and_its_files_valid_python(tmp_path: Path) -> None:
    script = controller.startup_script()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # the three boot files, as the script writes them, compile with this Python
    for name in ("gcs.py", "host_setup.py", "bootstrap.py"):
        text = script.split(f"/boot/{name} <<'TRANSIENT_BOOT'\n", 1)[1].split(
            "\nTRANSIENT_BOOT", 1)[0]
        (tmp_path / name).write_text(text)
        done = subprocess.run([sys.executable, "-m", "py_compile", str(tmp_path / name)])
        assert done.returncode == 0, name


def test_names() -> None:
    assert controller.controller_vm_name("lab-20261128-000000-abcd") == \
        "tc-lab-20261128-000000-abcd"
    assert len(controller.controller_vm_name("a" * 80)) <= 63
