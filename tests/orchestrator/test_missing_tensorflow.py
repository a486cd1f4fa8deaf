"""A run on the bare install (no TensorFlow) stops with one line naming the cause and the extra
to install, before anything is provisioned (issue 35), not "ps 0 exited with code 1".

The interpreters are real ones without TensorFlow: a fresh venv (nothing installed), and this
one with ``tensorflow`` blocked the way Python documents (``sys.modules[name] = None`` in a
sitecustomize), so neither the check nor an import can find it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.orchestrator.test_run_local import ENV

EXTRAS = "(pip install 'transient-orchestrator[cpu]', or [gpu] on a CUDA machine)"


def _run(repo_root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", "+experiment=digits_local",
                           "progress=false", *args], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_roles_interpreter_without_tensorflow_is_one_line(repo_root: Path,
                                                              tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")],
                   check=True)
    bare = tmp_path / "bare" / "bin" / "python"
    run_dir = tmp_path / "run"
    done = _run(repo_root, ENV, f"provider.python={bare}", f"hydra.run.dir={run_dir}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"config error: provider.python: provider=local runs the roles with {bare}, which has "
        f"no TensorFlow {EXTRAS}"]
    assert not (run_dir / "journal.jsonl").exists()  # nothing was provisioned


def test_this_interpreter_without_tensorflow_is_one_line(repo_root: Path,
                                                         tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo_root)])}
    done = _run(repo_root, env, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"config error: provider: provider=local runs the roles with {sys.executable}, which "
        f"has no TensorFlow {EXTRAS}"]
    # a remote run's preflight step trains here: the same cause, and the way around it (the
    # machines are TEST-NET-1 addresses, routed nowhere: nothing connects to them)
    (tmp_path / "key").write_text("")
    hosts = ", ".join(f"{{name: h{i}, address: 192.0.2.{i}, key_path: {tmp_path / 'key'}}}"
                      for i in range(1, 5))
    done = _run(repo_root, env, "provider=ssh", f"provider.hosts=[{hosts}]",
                "provider.trust_on_first_use=true", f"hydra.run.dir={tmp_path / 'run2'}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "config error: preflight: the preflight step trains on this machine, whose Python "
        f"({sys.executable}) has no TensorFlow {EXTRAS[:-1]}; or preflight=false)"]
