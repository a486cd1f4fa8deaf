"""``python -m orchestrator.controller {status,logs,attach,cancel,pull,resume} SWEEP``: follow
and steer a detached sweep from any machine with the user's Google credentials.

SWEEP is the ``gs://BUCKET/PREFIX/sweeps/<id>`` URL that ``--detach`` printed, or the bare
sweep id on the machine that submitted it (``index``). Nothing here talks to the controller
itself: every command reads and writes the sweep's objects in the bucket (``layout``) and, for
``cancel``, calls the Compute API, so no port is opened anywhere. The commands' settings
(endpoint, project, credentials) are the sweep's own (``submit/command.json``'s provider
section); ``--credentials`` replaces the identity on this machine.

Exit codes: 0 done, 1 a failure (storage, Compute API, a refusal), 2 a SWEEP that names no
detached sweep (one line), 130 ``logs -f`` stopped with Ctrl-C.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from orchestrator.controller import index, layout
from orchestrator.controller.remote import (
    BadSweep,
    Failed,
    Sweep,
    controller_cost,
    open_sweep,
    phase_text,
    point_statuses,
    stale,
)
from orchestrator.version import add_version_argument, docs_path, prog_name
from trainer.layout import EXIT_INTERRUPTED

MODULE = "orchestrator.controller"
#: Seconds between two reads of the console and the state while following.
FOLLOW_S = 2.0
#: How long ``cancel`` waits for the controller to stop the sweep by default.
CANCEL_WAIT_S = 300.0
#: Lines of the console ``attach`` shows before following it.
ATTACH_TAIL_LINES = 50
EXIT_OK, EXIT_FAILED, EXIT_BAD_SWEEP = 0, 1, 2


def _prog() -> str:
    return prog_name(MODULE)


def cmd_status(sweep: Sweep, args: argparse.Namespace) -> int:
    from orchestrator.display import make_console

    now = time.time()
    state = sweep.state()
    points = point_statuses(sweep, state)
    ctl_cost = controller_cost(sweep, state, now)
    command = sweep.command
    vm = (state.vm if state and state.vm else command.controller_vm) or "?"
    zone = (state.zone if state and state.zone else command.controller_zone) or "?"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(command.submitted_at)) \
        if command.submitted_at else "?"
    ended = sum(1 for p in points if p.status not in ("not started", "starting",
                                                     "running"))
    point_cost = sum(p.cost_usd or 0.0 for p in points)
    head = [f"sweep {sweep.urls.sweep_id}: {phase_text(state, now)}",
            f"controller {vm} ({zone}), ${ctl_cost:.4f} so far "
            f"(${command.controller_usd_per_hour:.4f}/h)",
            f"submitted {when} by {command.submitted_by or '?'}; state in {sweep.urls.root}"]
    if state is not None and state.message:
        head.append(f"message: {state.message}")
    tail = (f"{ended} of {len(points)} point(s) ended; cost so far ${point_cost + ctl_cost:.4f}"
            f" (points ${point_cost:.4f}, controller ${ctl_cost:.4f})")
    columns = ("point", "overrides", "status", "protocol", "step", "revocations", "cost")
    cells = [(str(p.num), " ".join(p.overrides) or "-", p.status, p.protocol or "-",
              "-" if p.step is None else
              f"{p.step}/{p.target}" if p.target is not None else str(p.step),
              "-" if p.revocations is None else str(p.revocations),
              "-" if p.cost_usd is None else f"${p.cost_usd:.4f}") for p in points]
    console = make_console()
    if console.is_terminal:
        from rich.table import Table

        table = Table(*columns)
        for row in cells:
            table.add_row(*row)
        for line in head:
            console.print(line, highlight=False, markup=False)
        console.print(table)
        console.print(tail, highlight=False, markup=False)
        return EXIT_OK
    out = sys.stdout
    for line in head:
        print(line, file=out)
    for row in cells:
        print(f"point {row[0]}: {row[1]}; {row[2]}; protocol {row[3]}; step {row[4]}; "
              f"revocations {row[5]}; cost {row[6]}", file=out)
    print(tail, file=out)
    return EXIT_OK


# --- logs and attach -------------------------------------------------------------------------


def _write(out: IO[bytes], data: bytes) -> None:
    out.write(data)
    out.flush()


def follow(sweep: Sweep, offset: int, out: IO[bytes], poll_s: float = FOLLOW_S,
           sleep: Callable[[float], None] = time.sleep) -> layout.ControllerState | None:
    """Print the console from byte `offset` as it grows until the controller's phase is
    terminal (then the rest); returns the last state. Raises Failed when the controller
    stopped answering (its console would never grow again)."""
    while True:
        state = sweep.state()
        data = sweep.console(offset)
        if data:
            _write(out, data)
            offset += len(data)
        if state is None or state.terminal:
            rest = sweep.console(offset)
            if rest:
                _write(out, rest)
            return state
        if state.phase in (layout.RUNNING, layout.CANCELLING) and stale(state):
            raise Failed(f"the controller of sweep {sweep.urls.sweep_id} is "
                         f"{phase_text(state)}; {_prog()} resume {sweep.urls.sweep_id} "
                         "continues the sweep")
        sleep(poll_s)


def cmd_logs(sweep: Sweep, args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    if not args.follow:
        text = sweep.console()
        _write(out, text)
        if not text:
            print(f"logs: sweep {sweep.urls.sweep_id} has printed nothing yet "
                  f"({phase_text(sweep.state())})", file=sys.stderr)
        return EXIT_OK
    try:
        follow(sweep, 0, out)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


def _tail_offset(text: bytes, lines: int) -> int:
    """The offset of the last `lines` lines of `text`."""
    cut = len(text)
    for _ in range(lines + 1):
        cut = text.rfind(b"\n", 0, cut)
        if cut < 0:
            return 0
    return cut + 1


def cmd_attach(sweep: Sweep, args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    try:
        start = _tail_offset(sweep.console(), ATTACH_TAIL_LINES)
        state = follow(sweep, start, out)
    except KeyboardInterrupt:
        print(f"\ndetached: the sweep goes on ({_prog()} attach {sweep.urls.sweep_id} to "
              "follow again)")
        return EXIT_OK
    print(f"sweep {sweep.urls.sweep_id}: {phase_text(state)}; {_prog()} pull "
          f"{sweep.urls.sweep_id} fetches the results into {sweep.pull_dir}")
    return EXIT_OK


# --- cancel ----------------------------------------------------------------------------------


def cmd_cancel(sweep: Sweep, args: argparse.Namespace) -> int:
    """Ask the controller to stop the sweep (it stops the orchestrator as Ctrl-C does: every
    VM released, runs recorded as interrupted); if it does not answer, delete the sweep's VMs
    from here, the controller's last."""
    state = sweep.state()
    if state is not None and state.terminal:
        print(f"sweep {sweep.urls.sweep_id} has already ended: {phase_text(state)}")
        return EXIT_OK
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    sweep.store.write_bytes(sweep.url(layout.CANCEL_FILE),
                            json.dumps({"requested": time.time(), "by": who}).encode())
    print(f"cancel: asked the controller of sweep {sweep.urls.sweep_id} to stop it")
    deadline = time.monotonic() + args.wait
    while True:
        if state is not None and state.terminal:
            print(f"sweep {sweep.urls.sweep_id}: {phase_text(state)}")
            deleted = release(sweep, state)  # what it left, and its VM if it is still there
            if deleted:
                print(f"cancel: deleted {len(deleted)} VM(s) the controller left: "
                      + ", ".join(deleted))
            return EXIT_OK
        if state is None or stale(state) or time.monotonic() >= deadline:
            break
        time.sleep(min(FOLLOW_S, max(0.0, deadline - time.monotonic())))
        state = sweep.state()
    why = (f"the controller did not stop the sweep within {args.wait:g} s"
           if state is not None and not stale(state)
           else f"the controller is {phase_text(state)}")
    print(f"cancel: {why}; deleting the sweep's VMs from here")
    deleted = release(sweep, state)
    sweep.write_state(layout.ControllerState(
        layout.CANCELLED, time.time(), vm=state.vm if state else sweep.command.controller_vm,
        zone=state.zone if state else sweep.command.controller_zone,
        started=state.started if state else None,
        message=f"cancelled by {who}: {why}; {len(deleted)} VM(s) deleted from there"))
    print(f"cancel: deleted {len(deleted)} VM(s)" + (": " + ", ".join(deleted)
                                                     if deleted else ""))
    print(f"sweep {sweep.urls.sweep_id}: cancelled; {_prog()} pull {sweep.urls.sweep_id} "
          "fetches what it recorded")
    return EXIT_OK


def release(sweep: Sweep, state: layout.ControllerState | None) -> list[str]:
    """Delete every VM labelled with this sweep (``tool`` and ``sweep-id``), then the
    controller VM, then whatever the sweep created meanwhile; returns ``zone/name`` of each VM
    deleted. Raises Failed naming the VMs that could not be deleted."""
    from concurrent.futures import ThreadPoolExecutor

    from provisioning.base import ProvisionError
    from provisioning.gce.api import ComputeApi, GceAuthError
    from provisioning.gce.body import label_value
    from provisioning.gce.config import TOOL_LABEL

    cfg = sweep.gce_config()
    try:
        api = ComputeApi(cfg, project=cfg.project)
    except GceAuthError as error:
        raise Failed(str(error)) from None
    ctl_vm = (state.vm if state and state.vm else sweep.command.controller_vm)
    ctl_zone = (state.zone if state and state.zone else sweep.command.controller_zone)
    label_filter = (f'labels.tool = "{TOOL_LABEL}" AND '
                    f'labels.sweep-id = "{label_value(sweep.urls.sweep_id)}"')
    deleted: list[str] = []
    problems: list[str] = []

    def remove(zone: str, name: str, listed: bool = True) -> None:
        """Delete one VM and wait until it is gone; one not `listed` (the controller, which
        may have deleted itself) counts only when it was still there."""
        try:
            if not listed:
                try:
                    operation = api.delete(zone, name)
                    if operation is None:
                        return  # gone already
                    api.wait(zone, operation, cfg.operation_timeout_s)
                    deleted.append(f"{zone}/{name}")
                    return
                except ProvisionError:  # deleting itself meanwhile, or not ready: as listed
                    pass
            api.remove(zone, name, cfg.operation_timeout_s)
            deleted.append(f"{zone}/{name}")
        except ProvisionError as error:
            problems.append(f"{zone}/{name}: {error}")

    def workers() -> list[tuple[str, str]]:
        try:
            listed = api.list_vms(label_filter)
        except ProvisionError as error:
            raise Failed(f"cannot list the sweep's VMs: {error}") from None
        return [(vm.zone, vm.name) for vm in listed if vm.name != ctl_vm]

    for attempt in range(2):  # again after the controller: what it created meanwhile
        found = workers()
        if found:
            with ThreadPoolExecutor(max_workers=min(cfg.max_parallel, len(found))) as pool:
                list(pool.map(lambda zn: remove(*zn), found))
        if attempt == 0 and ctl_vm and ctl_zone:
            remove(ctl_zone, ctl_vm, listed=False)
    if problems:
        raise Failed("could not delete " + "; ".join(problems))
    return deleted


# --- pull ------------------------------------------------------------------------------------


def cmd_pull(sweep: Sweep, args: argparse.Namespace) -> int:
    from orchestrator.controller.mirror import SweepMirror

    state = sweep.state()
    if state is not None and not state.terminal and not args.partial:
        raise Failed(f"sweep {sweep.urls.sweep_id} is {phase_text(state)}; its files "
                     f"are still changing (--partial pulls them as they are now, {_prog()} "
                     f"attach {sweep.urls.sweep_id} waits for the end)")
    dest = Path(args.dest) if args.dest is not None else sweep.pull_dir
    mirror = SweepMirror(sweep.store, dest, sweep.url(layout.MIRROR))
    names = mirror.pull(dest)
    print(f"pulled {len(names)} file(s) of sweep {sweep.urls.sweep_id} into {dest}")
    return EXIT_OK


# --- resume ----------------------------------------------------------------------------------


def cmd_resume(sweep: Sweep, args: argparse.Namespace) -> int:
    from orchestrator.controller import resume

    try:
        if args.detach:
            return resume.resume_detached(sweep.store, sweep.urls)
        cwd = sweep.cwd if sweep.cwd is not None and sweep.cwd.is_dir() else Path.cwd()
        return resume.resume_here(sweep.store, sweep.urls, cwd)
    except resume.ResumeRefused as error:
        raise Failed(str(error)) from None


# --- the command line ------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[Sweep, argparse.Namespace], int]] = {
    "status": cmd_status, "logs": cmd_logs, "attach": cmd_attach, "cancel": cmd_cancel,
    "pull": cmd_pull, "resume": cmd_resume}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


def parser() -> argparse.ArgumentParser:
    prog = _prog()
    top = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Follow and steer a detached sweep (python -m orchestrator ... --detach), "
        "from any machine with your Google credentials: everything goes through the sweep's "
        "objects in Cloud Storage and the Compute API; nothing connects to the controller.",
        epilog=f"SWEEP is the gs://BUCKET/PREFIX/{layout.SWEEPS}/SWEEP_ID URL printed at submit, "
        f"or, on the machine that submitted it, the bare SWEEP_ID (recorded in "
        f"{index.index_dir()}).\nExit codes: 0 done, 1 failed or refused, 2 a SWEEP that names "
        "no detached sweep.\nSee " + docs_path("detached.md") + ".")
    add_version_argument(top, MODULE)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("sweep", metavar="SWEEP",
                        help="gs://BUCKET/PREFIX/sweeps/SWEEP_ID, or SWEEP_ID submitted here")
    common.add_argument("--credentials", metavar="adc|FILE",
                        help="the Google identity on this machine (default: the sweep's "
                        "provider.credentials as the controller uses them, i.e. Application "
                        "Default Credentials)")
    sub = top.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="the controller's phase and cost, and "
                   "each point's status, protocol, step, revocations and cost so far",
                   description="The controller's phase (unresponsive when its heartbeat is "
                   "stale) and cost so far, and one row per point: its overrides, status, "
                   "protocol, step reached of its target, revocations and cost so far.")
    logs = sub.add_parser("logs", parents=[common], help="the sweep's console (-f: follow it)",
                          description="Print what the orchestrator printed on the controller,"
                          " as it would have on your terminal.")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing as it grows until the sweep ends (Ctrl-C stops "
                      "following, never the sweep; exit 130)")
    sub.add_parser("attach", parents=[common], help="follow the live progress (Ctrl-C "
                   "detaches; the sweep goes on)",
                   description="Show the console's last lines and follow it until the sweep "
                   "ends, then its final state. Ctrl-C detaches: the sweep goes on.")
    cancel = sub.add_parser(
        "cancel", parents=[common], help="stop the sweep and release every VM",
        description="Ask the controller to stop the sweep (as Ctrl-C stops an attached one: "
        "every VM released, runs recorded as interrupted) and wait for it. If the controller "
        "does not answer (its heartbeat is stale) or the wait runs out, delete every VM "
        "labelled with the sweep from here, the controller's last, and record the sweep as "
        "cancelled.")
    cancel.add_argument("--wait", type=_seconds, default=CANCEL_WAIT_S, metavar="S",
                        help=f"seconds to wait for the controller (default {CANCEL_WAIT_S:g})")
    pull = sub.add_parser(
        "pull", parents=[common], help="download the results into the sweep folder",
        description="Download the sweep folder (runs.csv, every point's summary, events, "
        "metrics, logs and TensorBoard files; checkpoints stay in the bucket) into the folder "
        "an attached sweep would have used: <the folder the sweep was submitted from>/"
        "<multirun/...>. Only files missing here or of another size are downloaded.")
    pull.add_argument("dest", nargs="?", metavar="DEST",
                      help="folder to pull into (default: where an attached sweep would "
                      "have written it)")
    pull.add_argument("--partial", action="store_true",
                      help="pull while the sweep still runs (the files as they are now)")
    resume = sub.add_parser(
        "resume", parents=[common], help="continue a sweep whose controller died",
        description="Once the controller is gone (its heartbeat stale; its VM deleted if "
        "still listed), pull the sweep and resume it on this machine as --resume does, or "
        "with --detach on a new controller VM.")
    resume.add_argument("--detach", action="store_true",
                        help="resume on a new controller VM instead of here")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from provisioning.base import ProvisionError
    from provisioning.gce.storage import StorageError

    try:
        sweep = open_sweep(args.sweep, args.credentials)
        return COMMANDS[args.verb](sweep, args)
    except BadSweep as error:
        print(f"{args.verb}: {error}", file=sys.stderr)
        return EXIT_BAD_SWEEP
    except Failed as error:
        print(f"{args.verb}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (StorageError, ProvisionError) as error:
        print(f"{args.verb}: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
