"""`python -m orchestrator.gc` against the fake: orphans of a SIGKILLed orchestrator are deleted,
the VMs of a live run are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator import gc
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    PROJECT,
    fake_fixture,
    gce_config,
    make_provider_fixture,
    small_request,
)

REPO = Path(__file__).resolve().parents[2]

# An orchestrator stand-in: acquires a cluster through the real provider, then hangs until killed.
ORCHESTRATOR = """
import sys, time
from pathlib import Path
from provisioning.gce.config import GceConfig
from provisioning.gce.provider import GceProvider
from tests.provisioning.gce_fixtures import small_request
endpoint, key, workdir = sys.argv[1:4]
cfg = GceConfig(project="test-project", zones=["us-central1-a"], api_endpoint=endpoint,
                credentials="anonymous", ssh_key=key, ready_poll_s=0.05, host_key_timeout_s=2)
GceProvider(cfg).acquire(small_request("killed-run", Path(workdir), workers=2))
print("acquired", flush=True)
time.sleep(600)
"""


def gc_args(fake: FakeGce, *extra: str) -> list[str]:
    return ["--project", PROJECT, "--api-endpoint", fake.endpoint, "--credentials",
            "anonymous", *extra]


def test_gc_deletes_orphans_of_a_killed_orchestrator_and_keeps_live_runs(
        fake: FakeGce, make_provider, tmp_path: Path, capsys) -> None:
    live_provider = make_provider()
    live_cluster = live_provider.acquire(small_request("live-run", tmp_path / "live", workers=1))
    key = gce_config(fake, tmp_path).ssh_key
    proc = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR, fake.endpoint, key,
                             str(tmp_path / "killed")], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "acquired"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    runs = {i.body["labels"]["run-id"] for i in fake.live_instances()}
    assert runs == {"live-run", "killed-run"}

    assert gc.main(gc_args(fake, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert out.count("would delete") == 3 and out.count("keeping") == 2
    assert len(fake.live_instances()) == 5  # dry run deleted nothing

    assert gc.main(gc_args(fake)) == 0
    assert {i.body["labels"]["run-id"] for i in fake.live_instances()} == {"live-run"}
    assert "3 deleted" in capsys.readouterr().out

    assert gc.main(gc_args(fake)) == 0  # idempotent: nothing left to delete
    assert "0 deleted" in capsys.readouterr().out
    live_provider.release(live_cluster)
    assert fake.live_instances() == []


def test_gc_without_credentials_says_how_to_authenticate(tmp_path: Path, capsys,
                                                        monkeypatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    assert gc.main(["--project", "p"]) == 2
    assert "gcloud auth application-default login" in capsys.readouterr().err
