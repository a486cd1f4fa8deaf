"""The `python -m trainer` command line: help text, and a clean exit on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_harness import REPO, LocalCluster, make_spec

from trainer.events import emit, parse_event, set_identity
from trainer.spec import PhaseSpec


def test_help_names_every_role() -> None:
    out = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=REPO, text=True,
                         capture_output=True, check=True).stdout
    assert "--role {ps,worker,chief,evaluator}" in out and "--spec" in out


def test_bad_role_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "trainer", "--role", "boss", "--spec", "x"],
                          cwd=REPO, text=True, capture_output=True)
    assert proc.returncode == 2 and "invalid choice: 'boss'" in proc.stderr


def test_event_line_format(capsys: pytest.CaptureFixture[str]) -> None:
    set_identity("chief", 0)
    emit("step", step=3, loss=0.5, steps_per_sec=10.0, lr=0.1)
    line = capsys.readouterr().out
    assert line.startswith("@event {") and line.endswith("}\n")
    event = parse_event(line)
    assert event["kind"] == "step" and event["role"] == "chief" and event["index"] == 0
    assert event["step"] == 3 and isinstance(event["time"], float)
    assert parse_event("plain log text") is None
    with pytest.raises(AssertionError, match="unknown event kind 'stepp'"):
        emit("stepp")


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_server_exits_on_sigterm(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, 1, [PhaseSpec("asp", 10)])
    cluster = LocalCluster(spec, tmp_path / "trainer_spec.json")
    try:
        ps = cluster.servers[0]
        assert ps.wait_event("ready", timeout=60)["address"] == spec.cluster["ps"][0]
        ps.proc.send_signal(signal.SIGTERM)
        assert ps.wait(10) == 143
    finally:
        cluster.stop()
