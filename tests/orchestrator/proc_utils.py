"""Process inspection for leak tests: what still runs that belongs to a run."""

from __future__ import annotations

import os
from pathlib import Path


def live_processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every live, non-zombie process whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found
