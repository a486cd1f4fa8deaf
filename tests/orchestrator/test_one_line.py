"""One line means one line: what the tool prints to a pipe (CI logs, files) is never
hard-wrapped, its messages say what happened (not the configured timeout), the docs show
fields as the tool prints them, and ``python -m bench --help`` only prints its usage."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.display import make_console
from provisioning.ssh.connection import SshConnection, SshTarget, SshTimeouts, SshUnreachableError

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "HYDRA_FULL_ERROR")}
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**clean, **(env or {})})


def test_the_dry_run_into_a_pipe_keeps_each_message_on_one_line() -> None:
    """The provider note is ~150 characters: rich wrapped it at 80 columns off a terminal."""
    proc = _run("-m", "orchestrator", "+experiment=digits_local", "dry_run=true")
    assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("note: local:")]
    assert len(notes) == 1, proc.stdout
    assert len(notes[0]) > 80 and notes[0].rstrip().endswith("nothing is billed"), notes[0]


def test_a_console_off_a_terminal_never_wraps_text(tmp_path: Path) -> None:
    console = make_console()
    assert not console.is_terminal  # pytest captures the output
    with console.capture() as captured:
        console.print("config error: " + "word " * 60, highlight=False)
    assert captured.get().count("\n") == 1, captured.get()


def test_an_unreachable_host_says_how_long_it_took_not_the_timeout() -> None:
    """A refused connection fails at once: the message must not claim 10 s went by."""
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection = SshConnection(SshTarget("m0", "127.0.0.1", port, "nobody", "/nonexistent"),
                               Path("/nonexistent/known_hosts"), False,
                               SshTimeouts(connect_s=10.0, connect_attempts=1))
    started = time.monotonic()
    with pytest.raises(SshUnreachableError) as info:
        connection.connect()
    took = time.monotonic() - started
    said = re.search(r"\(after ([\d.]+) s\)", str(info.value))
    assert said is not None, str(info.value)
    assert float(said.group(1)) <= took + 0.05, (str(info.value), took)
    assert "\n" not in str(info.value)


def test_the_docs_spell_fields_as_the_tool_prints_them() -> None:
    """Errors name list items as `hosts.0` (pasteable as an override), never `hosts[0]`."""
    for path in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                 *sorted((REPO / "conf").rglob("*.yaml"))):
        bracketed = re.findall(r"config error: [\w.]*\[\d+\]", path.read_text())
        assert not bracketed, f"{path.relative_to(REPO)}: {bracketed}"


def test_bench_help_prints_usage_and_measures_nothing() -> None:
    proc = _run("-m", "bench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m bench"), proc.stdout
    assert "--only" in proc.stdout and "baseline" not in proc.stdout
    bad = _run("-m", "bench", "--nothing")
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr, bad.stderr
