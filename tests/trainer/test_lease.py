"""trainer/control.py: a role's lease (no TensorFlow: the watcher runs in a plain process).

A role ends by itself when its lease file is gone, names another generation, or was not
renewed for its term; it keeps running while the file is renewed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from trainer.control import EXIT_LEASE_LOST, lease_lapsed
from trainer.layout import LEASE_ENV, LEASE_S_ENV, LEASE_TOKEN_ENV

REPO = Path(__file__).resolve().parents[2]
# A role's lease watcher, then nothing but waiting (as a PS serves): only the lease ends it.
ROLE = ("import time; from trainer.control import watch_lease; "
        "watch_lease(poll_s=0.1); print('up', flush=True); time.sleep(60)")


def test_lease_holds_lapses_and_names_the_generation(tmp_path: Path) -> None:
    lease = tmp_path / "LEASE"
    assert "gone" in lease_lapsed(lease, "a", 10.0)
    lease.write_text("a\n")
    assert lease_lapsed(lease, "a", 10.0) is None
    lease.write_text("b")
    assert "replaced" in lease_lapsed(lease, "a", 10.0)
    lease.write_text("a")
    old = time.time() - 30
    os.utime(lease, (old, old))
    assert "not renewed the lease for 30 s" in lease_lapsed(lease, "a", 10.0)
    assert lease_lapsed(lease, "a", 60.0) is None


def _role(lease: Path, token: str, term_s: float) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), **{
        LEASE_ENV: str(lease), LEASE_TOKEN_ENV: token, LEASE_S_ENV: str(term_s)})
    proc = subprocess.Popen([sys.executable, "-c", ROLE], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def test_a_role_outlives_its_term_while_renewed_and_ends_when_not(tmp_path: Path) -> None:
    lease = tmp_path / "LEASE"
    lease.write_text("gen1")
    role = _role(lease, "gen1", 1.0)
    try:
        renewed_until = time.time() + 2.5  # more than twice the term, renewed throughout
        while time.time() < renewed_until:
            os.utime(lease)
            time.sleep(0.2)
            assert role.poll() is None, "the role ended although its lease was renewed"
    finally:
        code, out = _wait(role, 30)  # no renewal now: ends after about the term
    assert code == EXIT_LEASE_LOST, out
    assert '"lease_lost"' in out and "not renewed" in out, out


def test_a_replaced_generation_ends_at_once(tmp_path: Path) -> None:
    lease = tmp_path / "LEASE"
    lease.write_text("gen1")
    role = _role(lease, "gen1", 600.0)
    lease.write_text("gen2")  # a newer deployment took this work dir over
    code, out = _wait(role, 30)
    assert code == EXIT_LEASE_LOST and "replaced" in out, out
