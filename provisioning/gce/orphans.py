"""Orphan collection for GCE, behind ``python -m orchestrator.gc [--dry-run] [--project P]``.

Every VM the GCE backend creates carries the label ``tool=transient-ps`` and the identity of the
orchestrator process that owns it (``owner-host``, ``owner-pid``, ``owner-start`` = the process's
start time in clock ticks, which guards against PID reuse). A VM is an orphan when its owner ran
on this machine and that process is gone, e.g. after ``kill -9`` of the orchestrator or a power
cut, when nothing was left to release it. VMs owned by another machine cannot be checked from
here; they are listed and deleted only with ``--any-host``. One aggregatedList finds them in every
zone; deletes run in parallel.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provisioning.base import ProvisionError
from provisioning.gce.body import label_value
from provisioning.gce.config import CREDENTIALS_ADC, TOOL_LABEL, GceConfig
from provisioning.journal import PROC_ROOT, process_is_live

LIVE, ORPHAN, FOREIGN = "live", "orphan", "other host"


def owner_status(labels: dict[str, str], this_host: str | None = None,
                 proc_root: Path = PROC_ROOT) -> str:
    """LIVE when the owning orchestrator process still runs here, ORPHAN when it ran here and is
    gone (or the labels are incomplete), FOREIGN when another machine owns it. Without /proc
    (macOS) a process that exists counts as the owner (`journal.process_is_live`)."""
    host = labels.get("owner-host")
    if host != label_value(this_host or socket.gethostname()):
        return FOREIGN if host else ORPHAN
    try:
        pid, start = int(labels["owner-pid"]), int(labels["owner-start"])
    except (KeyError, ValueError):
        return ORPHAN
    return LIVE if process_is_live(pid, start, proc_root) else ORPHAN


def main(argv: Sequence[str] | None = None) -> int:
    from trainer.layout import version_line  # provisioning/ may not import orchestrator/

    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.gc",
        description="Delete VMs labelled tool=transient-ps whose orchestrator is no longer "
        "running (orphans of a killed run), in every zone of the project.")
    parser.add_argument("--version", action="version", version=version_line("orchestrator.gc"),
                        help="print the tool's version and exit")
    parser.add_argument("--project", help="GCP project (default: $GOOGLE_CLOUD_PROJECT or ADC)")
    parser.add_argument("--dry-run", action="store_true", help="list, delete nothing")
    parser.add_argument("--any-host", action="store_true",
                        help="also delete VMs owned by orchestrators on other machines")
    parser.add_argument("--run-id", help="only VMs of this run")
    parser.add_argument("--credentials", default=CREDENTIALS_ADC,
                        help="adc (default), a service-account key file, or anonymous (fakes)")
    parser.add_argument("--api-endpoint", help="Compute API root (a local fake in tests)")
    args = parser.parse_args(argv)

    from provisioning.gce.api import ComputeApi, GceAuthError, ListedVm

    config = GceConfig(project=args.project, credentials=args.credentials,
                       api_endpoint=args.api_endpoint)
    try:
        api = ComputeApi(config)
        label_filter = f'labels.tool = "{TOOL_LABEL}"'
        if args.run_id:
            label_filter += f' AND labels.run-id = "{label_value(args.run_id)}"'
        vms = api.list_vms(label_filter)
    except GceAuthError as error:
        print(f"gc: {error}", file=sys.stderr)
        return 2
    except ProvisionError as error:
        print(f"gc: cannot list VMs: {error}", file=sys.stderr)
        return 1
    doomed = []
    for vm in sorted(vms, key=lambda v: (v.labels.get("run-id", ""), v.name)):
        status = owner_status(vm.labels)
        delete = status == ORPHAN or (status == FOREIGN and args.any_host)
        action = ("would delete" if args.dry_run else "deleting") if delete else "keeping"
        print(f"{action} {vm.zone}/{vm.name} (run {vm.labels.get('run-id', '?')}, "
              f"{vm.status}, owner {status})")
        if delete:
            doomed.append(vm)
    failures = 0
    if doomed and not args.dry_run:
        def delete(vm: ListedVm) -> str | None:
            try:
                api.remove(vm.zone, vm.name, config.operation_timeout_s)
            except ProvisionError as error:
                return f"{vm.name}: {error}"
            return None

        with ThreadPoolExecutor(max_workers=min(config.max_parallel, len(doomed))) as pool:
            for problem in pool.map(delete, doomed):
                if problem:
                    failures += 1
                    print(f"gc: could not delete {problem}", file=sys.stderr)
    verb = "to delete" if args.dry_run else "deleted"
    print(f"{len(vms)} VM(s) of this tool found, {len(doomed) - failures} {verb}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
