"""The controller VM of a detached sweep (provisioning/gce/controller.py): its body, its
startup script, and that script on one of the fake cloud's isolated VMs (Debian 13's own
Python, no pip, no Google library): it installs this tool from the bucket's wheel and a package
index and starts its command, or records why it could not. The agent it starts is tested with
the whole detached sweep (tests/provisioning/test_gce_detach.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.controller import layout
from provisioning.gce import controller
from provisioning.gce.body import LEASE_KEY, LEASE_S_KEY
from provisioning.gce.config import GceConfig
from provisioning.gce.storage import GcsStore, GcsUrl
from tests.fakes.isolated_gce import FAKE_TIMES, FAMILY, ZONES, IsolatedFakeGce
from tests.provisioning.gce_fixtures import BUCKET, storage_emulator
from tests.testbed.isolated import IsolatedTestBed

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


#: The stand-in for the agent: the tool and its dependencies import in the controller's venv,
#: and the tool's own storage code writes the bucket from the VM (what the agent does first).
STAND_IN = """
import json, platform, sys
import hydra, orchestrator
from google.cloud import compute_v1
from provisioning.gce.storage import GcsStore, GcsUrl
GcsStore().write_bytes(GcsUrl.parse(sys.argv[1]), json.dumps({
    "python": platform.python_version(), "hydra": hydra.__version__,
    "compute": compute_v1.__name__, "prefix": sys.prefix}).encode())
"""


def vm_logs(fake: IsolatedFakeGce, zone: str, name: str) -> str:
    """The controller VM's bootstrap and command logs, read from its disk (for a failure)."""
    upper = fake.host_of(zone, name).upper
    return "\n".join(f"--- {rel}\n" + ((upper / rel).read_text(errors="replace")[-3000:]
                                        if (upper / rel).exists() else "(none)")
                     for rel in ("var/log/transient-controller.log",
                                 "opt/transient-controller/agent.log"))


@pytest.mark.slow
@pytest.mark.headline  # make gce-fake: a VM boots and installs the tool (about a minute)
def test_the_controller_vm_installs_the_tool_and_starts_its_command(
        gce_isolated_bed: IsolatedTestBed, tmp_path: Path) -> None:
    """Two controller VMs: one finds its sweep's command and wheel in the bucket, installs the
    tool from them and the index and runs the stand-in; the other's sweep has no
    command.json, and its controller.json says so (what `status` shows)."""
    from tests.testbed import wheelhouse

    bed = gce_isolated_bed
    index_url = bed.serve_index(wheelhouse.controller_wheelhouse())
    wheel = controller.tool_wheel(tmp_path / "wheel")
    assert wheel is not None  # a checkout
    zone = ZONES[0]
    cfg = GceConfig(project="test-project", zones=[zone], image_project=FAMILY[0],
                    image_family=FAMILY[1], index_url=index_url, lease_s=0)
    with storage_emulator(address=bed.gateway) as emulator, \
            IsolatedFakeGce(bed, vms=2, zones=ZONES, **FAKE_TIMES) as fake:
        store = GcsStore()  # the emulator's (STORAGE_EMULATOR_HOST)
        good = layout.SweepUrls(f"gs://{BUCKET}/lab", "ctl-good-20261129-000000-0001")
        empty = layout.SweepUrls(f"gs://{BUCKET}/lab", "ctl-empty-20261129-000000-0002")
        command = layout.Command(sweep_id=good.sweep_id, overrides=[], sweep_dir="multirun/x",
                                 provider={}, wheel=wheel.name)
        store.write_bytes(GcsUrl.parse(good.child(layout.SUBMIT, layout.COMMAND_FILE)),
                          command.to_json().encode())
        store.write_bytes(GcsUrl.parse(good.child(layout.SUBMIT, wheel.name)),
                          wheel.read_bytes())
        marker = good.child("marker.json")
        python = f"{controller.HOME}/venv/bin/python"
        names = {}
        for urls in (good, empty):
            name = controller.controller_vm_name(urls.sweep_id)
            body = controller.controller_body(cfg, fake.project, zone, name, urls.root, None,
                                              {"STORAGE_EMULATOR_HOST": emulator}, 3600)
            body["metadata"]["items"].append({"key": controller.COMMAND_KEY, "value": (
                controller.shell_words([python, "-c", STAND_IN, marker]))})
            fake.insert(zone, body, None)
            names[urls.sweep_id] = name

        def state(urls: layout.SweepUrls) -> layout.ControllerState | None:
            text = store.read_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)))
            return layout.ControllerState.from_json(text.decode()) if text else None

        started = time.monotonic()
        while (made := store.read_bytes(GcsUrl.parse(marker))) is None:
            assert not fake.boot_errors, fake.boot_errors
            current = state(good)
            assert current is None or current.phase != layout.FAILED, (
                current, vm_logs(fake, zone, names[good.sweep_id]))
            assert time.monotonic() - started < 600, vm_logs(fake, zone, names[good.sweep_id])
            time.sleep(1.0)
        print(f"controller VM booted, installed the tool, ran its command: "
              f"{time.monotonic() - started:.0f} s")
        ran = json.loads(made)
        assert ran["python"].startswith("3.13.")  # the VM's own Python, not this machine's
        assert ran["prefix"] == f"{controller.HOME}/venv"
        booting = state(good)
        assert booting is not None and booting.phase == layout.BOOTING, booting
        assert booting.vm == names[good.sweep_id] and booting.zone == zone

        deadline = time.monotonic() + 120  # no pip there: it failed long before
        while (failed := state(empty)) is None or failed.phase == layout.BOOTING:
            assert time.monotonic() < deadline, (failed, vm_logs(fake, zone, names[empty.sweep_id]))
            time.sleep(1.0)
        assert failed.phase == layout.FAILED, failed
        assert failed.vm == names[empty.sweep_id]
        assert f"{empty.root}/submit/command.json is not in the bucket" in failed.message
        for name in names.values():
            fake.delete(zone, name, None)
        fake.assert_hosts_off(within_s=30)
