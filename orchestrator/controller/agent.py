"""The controller's side of a detached sweep: ``python -m orchestrator.controller.agent URL``.

Started by the controller VM's startup script (`provisioning/gce/controller.py`) once the tool is
installed. It unpacks the user's ``experiments/`` and ``conf/``, runs the submitted command,
unchanged but for what only made sense on the user's machine (``submit/command.json``), as a
child process (the orchestrator of an attached sweep, with every guarantee it has: leases,
recovery, clean-up on Ctrl-C), and keeps the bucket in step while it runs:

- ``sweep/``: the sweep folder, pushed every ``PUSH_S`` (only what changed) and once more at
  the end, so ``pull`` gets the files an attached sweep would have written;
- ``console.log``: what the orchestrator printed;
- ``controller.json``: the phase and a heartbeat every ``layout.HEARTBEAT_S``;
- ``cancel``: polled; when it appears the orchestrator gets SIGTERM (its Ctrl-C: every VM
  released, runs recorded as interrupted) and the phase becomes ``cancelled``.

When the orchestrator has ended (done, failed or cancelled) the agent deletes its own VM: the
controller costs nothing after its sweep. If the controller dies instead, the sweep's state is
in the bucket (launch journal, run folders, checkpoints) and ``python -m
orchestrator.controller resume`` continues it; the workers' VMs end within their lease.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from orchestrator.controller import layout

#: Seconds between two pushes of the sweep folder (what a controller's death can lose of it).
PUSH_S = 5.0
WORK_ENV = "TRANSIENT_CONTROLLER_DIR"  # where the agent works (default below)
DEFAULT_WORK = "/var/tmp/transient-controller"
#: How long the orchestrator may take to release everything after SIGTERM before SIGKILL.
STOP_GRACE_S = 600.0


class Agent:
    """One detached sweep on this controller."""

    def __init__(self, urls: layout.SweepUrls, work: Path) -> None:
        from provisioning.gce.storage import GcsUrl, store_for_provider

        self.urls = urls
        self.work = work
        self._url = GcsUrl.parse
        bootstrap = _storage_for_command()
        text = bootstrap.read_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.COMMAND_FILE)))
        if text is None:
            raise SystemExit(f"agent: no {layout.COMMAND_FILE} under {urls.submit}")
        self.command = layout.Command.from_json(text.decode())
        self.store = store_for_provider(self.command.provider)
        self.repo = work / "repo"
        self.sweep_dir = self.repo / self.command.sweep_dir
        self.console_path = work / layout.CONSOLE_FILE
        self.started = time.time()
        self.cancelled = False

    # the bucket ----------------------------------------------------------------------------
    def state(self, phase: str, **fields: object) -> None:
        record = layout.ControllerState(phase, time.time(), vm=self.command.controller_vm,
                                        zone=self.command.controller_zone,
                                        started=self.started, **fields)  # type: ignore[arg-type]
        self.store.write_bytes(self._url(self.urls.child(layout.STATE_FILE)),
                               record.to_json().encode())

    def cancel_requested(self) -> bool:
        return self.store.read_bytes(self._url(self.urls.child(layout.CANCEL_FILE))) is not None

    def push(self, mirror: object) -> None:
        mirror.push()  # type: ignore[attr-defined]
        if self.console_path.exists():  # only when it grew
            mirror.push_file(self.console_path,  # type: ignore[attr-defined]
                             self._url(self.urls.child(layout.CONSOLE_FILE)))

    # the sweep -----------------------------------------------------------------------------
    def unpack(self) -> None:
        data = self.store.read_bytes(self._url(self.urls.child(layout.SUBMIT,
                                                                layout.REPO_ARCHIVE)))
        self.repo.mkdir(parents=True, exist_ok=True)
        if data:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(self.repo, filter="data")

    def argv(self) -> list[str]:
        if self.command.resume:
            return [sys.executable, "-m", "orchestrator", "--resume", str(self.sweep_dir)]
        folder = "sweep" if is_sweep(self.command.overrides) else "run"
        return [sys.executable, "-m", "orchestrator", *self.command.overrides,
                f"hydra.{folder}.dir={self.command.sweep_dir}"]

    def record_cost(self, phase: str) -> None:
        """``<sweep folder>/controller.json``: what the controller itself cost (its VM at the
        catalog's on-demand price from its start to now), beside the runs' own costs: the
        detached sweep's bill is the runs' plus this."""
        from provisioning.catalog import cost_usd

        seconds = time.time() - self.started
        record = {"vm": self.command.controller_vm, "zone": self.command.controller_zone,
                  "machine_type": self.command.provider.get("controller_machine_type"),
                  "usd_per_hour": self.command.controller_usd_per_hour,
                  "seconds": round(seconds, 1), "phase": phase,
                  "cost_usd": round(cost_usd([self.command.controller_usd_per_hour],
                                             seconds), 6)}
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        (self.sweep_dir / layout.STATE_FILE).write_text(json.dumps(record, indent=1) + "\n")

    def run(self) -> int:
        from orchestrator.controller.mirror import SweepMirror

        self.unpack()
        mirror = SweepMirror(self.store, self.sweep_dir, self._url(self.urls.mirror))
        # a new controller, or this one rebooted: go on from what the bucket holds
        if not self.command.resume and mirror.store.list(mirror.url):
            self.command.resume = True
        if self.command.resume:
            mirror.pull(self.sweep_dir)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.command.env, "TRANSIENT_REPO": str(self.repo),
               "PYTHONUNBUFFERED": "1"}
        with open(self.console_path, "ab") as console:
            proc = subprocess.Popen(self.argv(), cwd=self.repo, env=env, stdout=console,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.state(layout.RUNNING, message=f"orchestrator pid {proc.pid}")
        stop_sent: float | None = None
        last_push = last_renewal = 0.0
        lease = Lease(self.command)
        while True:
            try:
                code = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - last_push >= PUSH_S:
                last_push = now
                with contextlib.suppress(Exception):  # a storage hiccup: the next push
                    if not self.cancelled and self.cancel_requested():
                        self.cancelled, stop_sent = True, now
                        proc.send_signal(signal.SIGTERM)  # the orchestrator's Ctrl-C
                    self.push(mirror)
                    self.state(layout.CANCELLING if self.cancelled else layout.RUNNING)
            if now - last_renewal >= min(layout.HEARTBEAT_S, lease.lease_s / 3):
                last_renewal = now
                try:
                    lease.renew()
                except Exception as error:  # the VM ends itself lease_s after the last one
                    print(f"agent: lease renewal failed: {error}", file=sys.stderr)
            if stop_sent is not None and now - stop_sent > STOP_GRACE_S:
                proc.kill()
        phase = (layout.CANCELLED if self.cancelled
                 else layout.DONE if code == 0 else layout.FAILED)
        self.record_cost(phase)
        for attempt in range(5):  # the final push: the record the user pulls
            try:
                self.push(mirror)
                self.state(phase, exit_code=code)
                break
            except Exception as error:
                print(f"agent: final push failed ({error}); retrying", file=sys.stderr)
                time.sleep(2.0 * (attempt + 1))
        return code


def is_sweep(overrides: list[str]) -> bool:
    """Whether the command is a sweep (Hydra's -m): its folder is hydra.sweep.dir, else
    hydra.run.dir."""
    return any(a in ("-m", "--multirun") for a in overrides)


def _storage_for_command():  # -> GcsStore
    """The bucket client before command.json is read: the VM's own identity (Application
    Default Credentials: its service account), or a local emulator the environment names."""
    from provisioning.gce.storage import GcsStore

    return GcsStore()


def delete_own_vm(command: layout.Command) -> None:
    """The controller's last act: delete its VM (its service account may; the cloud's
    maxRunDuration ends it anyway)."""
    from provisioning.gce.api import ComputeApi

    cfg = command.gce_config()
    ComputeApi(cfg, project=cfg.project).delete(command.controller_zone, command.controller_vm)


class Lease:
    """The controller VM's lease (`provider.lease_s`), renewed with every heartbeat: a VM whose
    agent died (the VM still up) ends itself, as the workers' VMs do when their orchestrator
    dies (`provisioning/gce/body.py`'s lease watcher, started by the controller's startup
    script)."""

    def __init__(self, command: layout.Command) -> None:
        from provisioning.gce.api import ComputeApi

        self.command = command
        cfg = command.gce_config()
        self.lease_s = cfg.lease_s
        self.api = ComputeApi(cfg, project=cfg.project) if cfg.lease_s > 0 else None
        self._stamp = 0.0

    def renew(self) -> None:
        from provisioning.gce.body import LEASE_KEY, lease_value

        if self.api is None or not self.command.controller_vm:
            return
        self._stamp = max(time.time() + self.lease_s, self._stamp + 1)  # always a new value
        self.api.set_metadata_value(self.command.controller_zone, self.command.controller_vm,
                                    LEASE_KEY, lease_value(self._stamp))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    urls = layout.SweepUrls.parse(args[0])
    work = Path(os.environ.get(WORK_ENV, DEFAULT_WORK)) / urls.sweep_id
    work.mkdir(parents=True, exist_ok=True)
    agent = Agent(urls, work)
    try:
        code = agent.run()
    except BaseException as error:  # the record says why the controller stopped
        with contextlib.suppress(Exception):
            agent.state(layout.FAILED, message=f"agent: {type(error).__name__}: {error}")
        raise
    if os.environ.get("TRANSIENT_CONTROLLER_KEEP_VM") != "1":
        try:
            delete_own_vm(agent.command)
        except Exception as error:
            print(f"agent: could not delete the controller VM: {error}; the cloud ends it at "
                  "its maxRunDuration", file=sys.stderr)
    print(json.dumps({"exit_code": code}))
    return code


if __name__ == "__main__":
    sys.exit(main())
