"""``python -m orchestrator.release PATH...``: release what crashed runs left behind.

Every run records each process group (and, for cloud backends, each VM) it creates in its
``journal.jsonl`` before using it, and marks it released on teardown. After a crash of the
orchestrator itself (power loss, ``kill -9`` of a parent that had no parent-death signal), this
command stops whatever a journal still lists as running, then marks such runs ``killed``
(summary.json and their runs.csv row). Each entry is handed to its own backend's clean-up
(built with the run's ``provider`` config from ``config.yaml``), which acts on the entry's
host: a remote pid is never signalled on this machine. Idempotent: a second call does nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.rundir import index
from orchestrator.rundir.results import CONFIG_FILE
from orchestrator.version import add_version_argument, prog_name
from provisioning.journal import JOURNAL_FILE, clean_up


def find_journals(paths: Sequence[Path]) -> list[Path]:
    """Journals in the given run or sweep directories (searched recursively) or files."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(path.rglob(JOURNAL_FILE)))
    return found


def provider_configs(run_dir: Path) -> dict[str, Any]:
    """The run's provider section by backend name ({} when the run recorded no config)."""
    try:
        config = yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    provider = config.get("provider") if isinstance(config, dict) else None
    if not isinstance(provider, dict) or "name" not in provider:
        return {}
    return {str(provider["name"]): provider}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog_name("orchestrator.release"),
        description="Stop the processes (and list the VMs) that runs' journals still record "
        "as running, e.g. after the orchestrator itself crashed.")
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("outputs"), Path("multirun")],
                        help="run or sweep directories, or journal files "
                        "(default: outputs/ and multirun/)")
    add_version_argument(parser, "orchestrator.release")
    args = parser.parse_args(argv)
    journals = find_journals(args.paths)
    acted = 0
    for journal in journals:
        for line in clean_up(journal, configs=provider_configs(journal.parent)):
            print(f"{journal.parent}: {line}")
            acted += 1
    print(f"{len(journals)} journal(s) checked, {acted} resource(s) released")
    for path in args.paths:  # runs whose orchestrator died: status killed, row in runs.csv
        for run_dir in index.mark_killed_runs(path) if path.is_dir() else []:
            print(f"{run_dir}: status killed (the orchestrator died before writing a summary)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
