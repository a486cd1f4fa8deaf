"""``python -m orchestrator.controller resume SWEEP [--detach]``: a detached sweep whose
controller died goes on, here or on a new controller.

The controller is on-demand but can still crash or be deleted. Everything a resume needs is in
the bucket: the launch journal, runs.csv and every run folder (``sweep/``, pushed every few
seconds), and the checkpoints (``provider.storage``). So, once the old controller is known to be
gone (its heartbeat stale; its VM, if still listed, deleted first: two orchestrators must never
own one sweep), the mirror is pulled into the folder an attached sweep would have used and the
sweep is resumed exactly as a killed orchestrator's is (:mod:`orchestrator.resume`): completed
points kept, killed ones continued from their newest checkpoint, the rest started. With
``--detach`` a new controller VM does that instead (``command.json``'s ``resume``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from orchestrator.controller import layout

#: A controller not heard from for this long (and not finished) is taken for dead.
STALE_S = 3 * layout.HEARTBEAT_S


class ResumeRefused(Exception):
    """One line: why this sweep cannot be resumed now."""


def read_command(store, urls: layout.SweepUrls) -> layout.Command:  # store: GcsStore
    from provisioning.gce.storage import GcsUrl

    text = store.read_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.COMMAND_FILE)))
    if text is None:
        raise ResumeRefused(f"resume: {urls.root} holds no detached sweep ({layout.SUBMIT}/"
                            f"{layout.COMMAND_FILE} is missing)")
    return layout.Command.from_json(text.decode())


def read_state(store, urls: layout.SweepUrls) -> layout.ControllerState | None:
    from provisioning.gce.storage import GcsUrl

    text = store.read_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)))
    return layout.ControllerState.from_json(text.decode()) if text else None


def take_over(store, urls: layout.SweepUrls, now: float | None = None) -> layout.Command:
    """Check the old controller is gone (refuse while it lives or when the sweep is done),
    delete its VM if the cloud still lists it, and return the sweep's command."""
    command = read_command(store, urls)
    state = read_state(store, urls)
    now = time.time() if now is None else now
    if state is not None and state.phase == layout.DONE:
        raise ResumeRefused(f"resume: sweep {urls.sweep_id} is done; python -m "
                            f"orchestrator.controller pull {urls.sweep_id} fetches its results")
    if state is not None and not state.terminal and state.age_s(now) < STALE_S:
        raise ResumeRefused(
            f"resume: the controller of sweep {urls.sweep_id} ({state.vm or command.controller_vm}"
            f") is alive (heard from {state.age_s(now):.0f} s ago, phase {state.phase}): follow "
            f"it with python -m orchestrator.controller attach {urls.sweep_id}, or stop it "
            "with cancel")
    from provisioning.gce.api import ComputeApi

    cfg = command.gce_config()
    api = ComputeApi(cfg, project=cfg.project)
    vm = (state.vm if state is not None and state.vm else command.controller_vm)
    zone = (state.zone if state is not None and state.zone else command.controller_zone)
    if vm:
        api.remove(zone, vm, cfg.operation_timeout_s)  # gone already: nothing to do
    return command


def resume_here(store, urls: layout.SweepUrls, cwd: Path) -> int:
    """Pull the sweep into ``cwd/<sweep folder>`` and resume it attached, on this machine."""
    from orchestrator.controller.mirror import SweepMirror
    from provisioning.gce.storage import GcsUrl

    command = take_over(store, urls)
    folder = cwd / command.sweep_dir
    SweepMirror(store, folder, GcsUrl.parse(urls.mirror)).pull(folder)
    store.write_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)), layout.ControllerState(
        layout.FAILED, time.time(), message=f"controller lost; resumed attached in {folder}",
    ).to_json().encode())
    print(f"resume: sweep {urls.sweep_id} pulled into {folder}; resuming it here")
    return subprocess.call([sys.executable, "-m", "orchestrator", "--resume", str(folder)],
                           cwd=cwd)


def resume_detached(store, urls: layout.SweepUrls) -> int:
    """Start a new controller that resumes the sweep from the bucket."""
    from provisioning.gce.controller import (
        controller_body,
        controller_vm_name,
        create_controller,
    )
    from provisioning.gce.storage import GcsUrl

    command = take_over(store, urls)
    # a name of its own: the old VM may still be deleting
    vm = f"{controller_vm_name(urls.sweep_id)}"[:55] + time.strftime("-r%H%M%S", time.gmtime())
    command = replace(command, resume=True, controller_vm=vm, submitted_at=time.time())
    store.write_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.COMMAND_FILE)),
                      command.to_json().encode())
    store.write_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)), layout.ControllerState(
        layout.SUBMITTED, time.time(), vm=vm, zone=command.controller_zone,
        message="resumed by a new controller").to_json().encode())
    cfg = command.gce_config()
    from provisioning.gce.api import ComputeApi

    api = ComputeApi(cfg, project=cfg.project)
    body = controller_body(cfg, cfg.project, command.controller_zone, vm, urls.root, None,
                           command.env, None)
    create_controller(api, command.controller_zone, body, cfg.operation_timeout_s)
    print(f"resume: sweep {urls.sweep_id} goes on on controller VM {vm} "
          f"({command.controller_zone})")
    return 0
