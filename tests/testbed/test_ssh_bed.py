"""The SSH test bed (sshd hosts in network namespaces on this machine's files) cleans up after
itself, also when its test process is SIGKILLed: the next bed sweeps what a dead owner left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.testbed import SSH_BEDS_DIR, SshTestBed, bed_leftovers, skip_reason, sweep_stale_beds

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.namespaces]


@pytest.fixture(autouse=True)
def _needs_the_bed() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def test_close_leaves_nothing(tmp_path: Path) -> None:
    with SshTestBed(tmp_path, hosts=2) as bed:
        assert len(bed.leftovers()) == 5  # 2 namespaces, 2 veths, the bridge
        assert (SSH_BEDS_DIR / bed.tag / "owner").exists()
    assert bed.leftovers() == []
    assert not (SSH_BEDS_DIR / bed.tag).exists()


def test_a_sigkilled_owners_bed_is_swept_by_the_next(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import json, time
        from tests.testbed import SshTestBed
        bed = SshTestBed({str(tmp_path / "dead")!r}, hosts=1)
        print(json.dumps({{"tag": bed.tag, "sshd": bed.hosts[0].sshd.pid}}), flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        state = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    prefix = f"tb{state['tag']}"
    assert bed_leftovers(prefix), "expected the dead bed's namespace and links until a sweep"
    sweep_stale_beds(SSH_BEDS_DIR, "tb")  # (a bed starting now may sweep it first: also fine)
    assert bed_leftovers(prefix) == []
    assert not (SSH_BEDS_DIR / state["tag"]).exists()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{state['sshd']}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # (`ip netns exec` replaced itself with sshd: its pid is sshd's)
    assert not Path(f"/proc/{state['sshd']}").exists(), "the dead bed's sshd outlived the sweep"
