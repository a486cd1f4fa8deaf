"""The GCE backend's pure parts: error classification, VM bodies, and the VM-side preemption
watcher run for real against the fake metadata server."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from provisioning.base import PREEMPTION_NOTICE_FILE, BadRequestError
from provisioning.gce.body import (
    SPOT_SHUTDOWN_WINDOW_S,
    VmRequest,
    accelerators,
    instance_body,
    label_value,
    vm_name,
    watcher_script,
)
from provisioning.gce.config import GceConfig, TerminationAction
from provisioning.gce.errors import (
    ErrorItem,
    QuotaError,
    TransientApiError,
    ZoneCapacityError,
    classify,
)
from tests.fakes.gce_server import FakeGce

ZONE = "us-central1-a"


@pytest.mark.parametrize(("status", "items", "expected"), [
    (503, [ErrorItem("ZONE_RESOURCE_POOL_EXHAUSTED", "no resources")], ZoneCapacityError),
    (503, [ErrorItem("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "a g2 is unavailable")],
     ZoneCapacityError),
    (503, [ErrorItem("insufficientCapacity", "bulk")], ZoneCapacityError),
    (403, [ErrorItem("QUOTA_EXCEEDED", "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  "
                     "Limit: 0.0 in region us-central1.")], QuotaError),
    (403, [ErrorItem("quotaExceeded", "Quota exceeded", "CPUS")], QuotaError),
    (403, [ErrorItem("rateLimitExceeded", "slow down")], TransientApiError),
    (429, [ErrorItem("", "too many")], TransientApiError),
    (500, [ErrorItem("", "backend error")], TransientApiError),
    (400, [ErrorItem("invalid", "The resource 'projects/p/zones/z/acceleratorTypes/"
                     "nvidia-tesla-k80' was not found")], BadRequestError),
    (403, [ErrorItem("IAM_PERMISSION_DENIED", "no")], BadRequestError),
])
def test_classify_decides_once(status: int, items: list[ErrorItem], expected: type) -> None:
    error = classify(ZONE, status, items)
    assert type(error) is expected


def test_quota_error_names_metric_and_scope() -> None:
    regional = classify(ZONE, 403, [ErrorItem("QUOTA_EXCEEDED", "Quota 'NVIDIA_T4_GPUS' "
                                              "exceeded.  Limit: 1.0 in region us-central1.")])
    assert isinstance(regional, QuotaError)
    assert (regional.metric, regional.region) == ("NVIDIA_T4_GPUS", "us-central1")
    assert "NVIDIA_T4_GPUS" in str(regional) and "region us-central1" in str(regional)
    everywhere = classify(ZONE, 403, [ErrorItem("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' "
                                                "exceeded.  Limit: 0.0 globally.")])
    assert isinstance(everywhere, QuotaError) and everywhere.region is None
    from_details = classify(ZONE, 403, [ErrorItem("QUOTA_EXCEEDED", "over", "CPUS")])
    assert isinstance(from_details, QuotaError) and from_details.metric == "CPUS"
    # Every *_ALL_REGIONS metric is project-wide: another region cannot help (audit row 9).
    cpus = classify(ZONE, 403, [ErrorItem("QUOTA_EXCEEDED", "Quota 'CPUS_ALL_REGIONS' exceeded."
                                          "  Limit: 32.0 globally.")])
    assert isinstance(cpus, QuotaError) and cpus.region is None and "all regions" in str(cpus)
    detail_only = classify(ZONE, 403, [ErrorItem("QUOTA_EXCEEDED", "over", "CPUS_ALL_REGIONS")])
    assert isinstance(detail_only, QuotaError) and detail_only.region is None


def test_gpus_attach_to_n1_or_come_built_in() -> None:
    assert accelerators("n1-standard-8", "t4") == [
        {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
    assert accelerators("g2-standard-4", "l4") == []
    assert accelerators("a2-highgpu-1g", None) == []
    assert accelerators("n1-standard-4", None) == []
    with pytest.raises(BadRequestError, match="a2"):
        accelerators("n1-standard-8", "a100")
    with pytest.raises(BadRequestError, match="built-in"):
        accelerators("g2-standard-4", "t4")
    with pytest.raises(BadRequestError, match="N1"):
        accelerators("e2-standard-4", "t4")


def test_names_and_labels_are_valid_gce_identifiers() -> None:
    name = vm_name("CIFAR10_res32-20261122-194500-abcdef" * 3, "worker-15", 123)
    assert len(name) <= 63 and name.endswith("-worker-15-123")
    assert name[0].isalpha() and all(c.islower() or c.isdigit() or c == "-" for c in name)
    assert label_value("Run_ID.With:Odd Chars" * 5) == ("run_id-with-odd-chars" * 5)[:63]


def test_body_spot_options_image_and_disk() -> None:
    cfg = GceConfig(termination_action=TerminationAction.STOP, max_run_duration_s=7200,
                    image="projects/p/global/images/mine", boot_disk_gb=80)
    vm = VmRequest(name="tp-r-worker-0-1", zone=ZONE, machine_type="g2-standard-4", gpu="l4",
                   transient=True, labels={"run-id": "r"}, host_ids=["r-worker-0-1"],
                   network_ip="10.128.0.9")
    body = instance_body(cfg, "proj", vm, "r", "ssh-ed25519 AAAA me")
    assert body["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": False,
                                  "maxRunDuration": {"seconds": "7200"}}
    assert "guestAccelerators" not in body  # L4 is built into G2
    disk = body["disks"][0]["initializeParams"]  # type: ignore[index]
    assert disk["sourceImage"] == "projects/p/global/images/mine" and disk["diskSizeGb"] == "80"
    assert body["networkInterfaces"][0]["networkIP"] == "10.128.0.9"  # type: ignore[index]
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}  # type: ignore[index]
    assert items["install-nvidia-driver"] == "True"


@pytest.mark.skipif(shutil.which("curl") is None, reason="the VM watcher uses curl; not here")
def test_watcher_writes_the_trainers_notice_when_preempted(tmp_path: Path) -> None:
    """The startup script's watcher, run as bash against the fake metadata server: the notice
    appears (same file name and JSON as the local backend's) only after the preemption."""
    with FakeGce(provision_s=0, staging_s=0, insert_op_s=0) as fake:
        fake.insert(ZONE, {"name": "vm-1", "scheduling": {"provisioningModel": "SPOT",
                                                           "instanceTerminationAction": "DELETE"}},
                    None)
        notices = {f"h{i}": str(tmp_path / f"h{i}" / PREEMPTION_NOTICE_FILE) for i in range(2)}
        script = tmp_path / "watch.sh"
        script.write_text(watcher_script(notices, owner="nobody"))
        env = {"PATH": "/usr/bin:/bin", "TRANSIENT_METADATA_URL": fake.metadata_url(ZONE, "vm-1")}
        proc = subprocess.Popen(["bash", str(script)], env=env)
        try:
            time.sleep(1.0)  # the watcher is long-polling; no notice yet
            assert not any(Path(p).exists() for p in notices.values())
            before = time.time()
            fake.preempt(ZONE, "vm-1")
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for host, path in notices.items():
            notice = json.loads(Path(path).read_text())
            assert notice["host_id"] == host
            assert before - 1 <= notice["deadline"] - SPOT_SHUTDOWN_WINDOW_S <= time.time() + 1
