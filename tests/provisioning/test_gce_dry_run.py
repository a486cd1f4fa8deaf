"""The dry run of `provider=gce` against the fake Compute API: the pre-create checks `acquire`
makes (quotas against the plan, image family, bucket, OS Login mode) are read and printed, and
nothing is created; every VM's maxRunDuration is derived from the plan (or set) and shown, and
the VMs a run creates carry it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from provisioning.base import HostSpec, Role
from provisioning.gce.config import (
    RUN_MAX_S,
    RUN_MIN_S,
    RUN_SAFETY_FACTOR,
    RUN_SETUP_ALLOWANCE_S,
    RUN_UNKNOWN_S,
    GceConfig,
    derived_run_duration_s,
)
from provisioning.gce.provider import GceProvider
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    BUCKET,
    PROJECT,
    fake_fixture,
    gce_config,
    make_provider_fixture,
    small_request,
    storage_emulator,
)

REPO = Path(__file__).resolve().parents[2]


def dry_run(fake: FakeGce, tmp_path: Path, *overrides: str) -> str:
    """`python -m orchestrator +experiment=cifar10_res32 dry_run=true` against the fake."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250"}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=cifar10_res32", "dry_run=true",
         "sim.repeats=3", f"provider.api_endpoint={fake.endpoint}",
         "provider.credentials=anonymous", f"provider.project={PROJECT}",
         f"data_cache={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_dry_run_prints_the_pre_create_checks_and_creates_nothing(tmp_path: Path) -> None:
    with FakeGce(project=PROJECT, zones=("us-west1-b", "us-central1-a")) as fake:
        fake.set_quota("GPUS_ALL_REGIONS", 2)  # the plan's 4 Spot T4 workers need 4
        fake.set_quota("CPUS_ALL_REGIONS", 64)
        fake.set_quota("PREEMPTIBLE_NVIDIA_T4_GPUS", 8, region="us-west1")
        with storage_emulator():
            out = dry_run(fake, tmp_path, f"provider.storage=gs://{BUCKET}/runs")
        calls, live = dict(fake.calls), fake.live_instances()
    notes = [line.strip() for line in out.splitlines()
             if line.strip().startswith(("ok:", "problem:", "not checked:", "maxRunDuration"))]
    text = "\n".join(notes)
    assert ("problem: quota GPUS_ALL_REGIONS (all regions): the plan needs 4, 2 free (limit 2, "
            "0 in use)") in text
    assert "ok: quota CPUS_ALL_REGIONS (all regions): the plan needs 20, 64 free" in text
    assert ("ok: quota PREEMPTIBLE_NVIDIA_T4_GPUS in region us-west1: the plan needs 4, "
            "8 free") in text
    assert re.search(r"ok: image family common-cu129-ubuntu-2404-nvidia-580 \(project "
                     r"deeplearning-platform-release\) resolves to "
                     r"common-cu129-ubuntu-2404-nvidia-580-v20260909", text)
    assert f"ok: bucket of gs://{BUCKET}/runs exists and takes a write" in text
    assert f"ok: OS Login off in project {PROJECT}" in text
    assert len([n for n in notes if n.startswith("problem:")]) == 1, text
    # maxRunDuration from the plan's predicted train time, as the formula says
    found = re.search(r"maxRunDuration of every VM: (\d+) s .*\(predicted train time (\d+) s "
                      r"x 3 \+ 1800 s setup", text)
    assert found, text
    assert int(found.group(1)) == derived_run_duration_s(float(found.group(2)))
    # read, not created
    assert calls.get("instances.insert", 0) == 0 and live == []
    assert calls["projects.get"] == 1 and calls["images.getFromFamily"] == 1


def test_the_dry_run_shows_a_set_max_run_duration_and_os_login_needing_a_user(
        fake: FakeGce, tmp_path: Path) -> None:
    fake.project_metadata["enable-oslogin"] = "TRUE"
    cfg = gce_config(fake, tmp_path, max_run_duration_s=7200).for_plan(1000.0)
    hosts = small_request("dry", tmp_path).hosts
    preview = GceProvider.preview(hosts, cfg)
    notes = "\n".join(preview.notes)
    assert "maxRunDuration of every VM: 7200 s (2.0 h) (provider.max_run_duration_s)" in notes
    assert (f"problem: provider.os_login_user: project {PROJECT} has OS Login on; set it to "
            "the e-mail") in notes
    with_user = GceProvider.preview(hosts, gce_config(fake, tmp_path, os_login_user="me@x.org"))
    assert "ok: OS Login on in project test-project: the run imports the key for me@x.org" \
        in "\n".join(with_user.notes)
    assert fake.calls["oslogin.importSshPublicKey"] == 0  # the dry run changes no profile
    assert fake.calls["instances.insert"] == 0


def test_without_credentials_the_dry_run_says_the_checks_were_not_made(
        fake: FakeGce, tmp_path: Path) -> None:
    cfg = gce_config(fake, tmp_path, credentials="/nonexistent/key.json")
    preview = GceProvider.preview(small_request("dry", tmp_path).hosts, cfg)
    assert preview.rows and preview.notes[-1].startswith(
        "not checked: quotas, image, bucket, OS Login (no credentials: provider.credentials: "
        "cannot read service-account key '/nonexistent/key.json'")
    assert fake.calls["projects.get"] == 0


def test_max_run_duration_is_derived_from_the_plan_within_bounds() -> None:
    assert derived_run_duration_s(None) == RUN_UNKNOWN_S
    assert derived_run_duration_s(60.0) == RUN_MIN_S  # setup alone may take half an hour
    assert derived_run_duration_s(1e7) == RUN_MAX_S
    assert derived_run_duration_s(4000.0) == int(4000 * RUN_SAFETY_FACTOR + RUN_SETUP_ALLOWANCE_S)
    fitted = GceConfig().for_plan(4000.0)
    assert fitted.run_duration_s() == 13800 and fitted.transient_lifetime_cap_s() == 13800.0
    assert GceConfig().run_duration_s() == RUN_UNKNOWN_S  # no plan read: still bounded
    assert GceConfig(max_run_duration_s=0).for_plan(4000.0).run_duration_s() is None  # off
    assert GceConfig(max_run_duration_s=5000).for_plan(4000.0).run_duration_s() == 5000
    problems = dict(GceConfig(max_run_duration_s=10).check())
    assert "outside GCE's range (30 s to 120 days)" in problems["provider.max_run_duration_s"]


def test_the_vms_of_a_run_carry_the_derived_max_run_duration(fake: FakeGce, make_provider,
                                                             tmp_path: Path) -> None:
    provider = make_provider()
    provider.config = provider.config.for_plan(4000.0)
    request = small_request("life", tmp_path, workers=1)
    cluster = provider.acquire(request)
    try:
        lives = {i.body["labels"]["role"]: i.body["scheduling"]["maxRunDuration"]
                 for i in fake.live_instances()}
        assert lives == {"ps_chief_evaluator": {"seconds": "13800"},
                         "worker": {"seconds": "13800"}}
    finally:
        provider.release(cluster)


def test_a_host_without_a_zone_is_previewed_in_the_first_of_provider_zones() -> None:
    hosts = [HostSpec("ps-0", Role.PS, "n1-standard-4")]
    preview = GceProvider.preview(hosts, GceConfig(zones=["europe-west4-a"]))
    assert preview.rows[0][0] == "europe-west4-a"  # the first fallback zone, not "?"
