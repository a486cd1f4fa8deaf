"""``--detach``: the user's side of a detached sweep.

The same command a user would run attached, plus ``--detach``, runs on a small on-demand
controller VM in the cluster's zone instead of on this machine (SkyPilot's managed-jobs
controller, and the seeds' own XML-RPC master, did the same): the sweep then outlives the
laptop. Before anything is created here, every point is checked exactly as an attached sweep
checks it (a dry run of the whole command: configs, plans, the cloud's pre-flight) and the job
trains one step locally (``preflight``). Then, under ``<provider.storage>/sweeps/<id>/``
(:mod:`orchestrator.controller.layout`):

- ``submit/``: the command (its overrides, as the controller must run them), the user
  repository's ``experiments/`` and ``conf/`` as this command saw them (the controller needs no
  access to the user's git) and this tool's wheel;
- ``data/``: a ``job.data_dir`` of this machine, uploaded once (the VMs read it from there:
  the data crosses this machine's link once, not once per VM);
- ``controller.json``: ``submitted``.

The controller VM gets no key or credential of the user's: it acts as its service account, and
logs into the workers' VMs with a key it makes itself. The command returns after printing where
the sweep runs and how to follow it (``python -m orchestrator.controller ...``).
"""

from __future__ import annotations

import getpass
import io
import os
import socket
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.controller import layout
from orchestrator.controller.agent import is_sweep
from provisioning.base import ProvisionError
from trainer.layout import EXIT_INTERRUPTED

FLAG = "--detach"
#: Variables of the Google client libraries that point them at a local stand-in (an emulator,
#: tests' fakes): passed to the controller so it talks to the same services. Never credentials.
STAND_IN_ENV = ("STORAGE_EMULATOR_HOST",)
#: Overrides that only make sense on this machine: the controller uses its own key and folder.
_LOCAL_ONLY = ("provider.ssh_key=", "provider.credentials=", "hydra.sweep.dir=",
               "hydra.run.dir=", "job.data_dir=", "preflight=")
_SWEEP_FLAGS = ("-m", "--multirun")
#: A controller VM's life without a prediction: the cloud ends it after this (7 days).
CONTROLLER_MAX_S = 7 * 24 * 3600


def requested(argv: Sequence[str]) -> bool:
    """`--detach`, or `--resume gs://.../sweeps/<id>` (a detached sweep, resumed)."""
    return FLAG in argv[1:] or detached_resume(argv) is not None


def detached_resume(argv: Sequence[str]) -> str | None:
    """The sweep URL of ``--resume gs://BUCKET/PREFIX/sweeps/<id>``, None for anything else
    (``--resume DIR`` is a local folder: orchestrator/resume.py)."""
    args = list(argv[1:])
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--resume=") else (
            args[i + 1] if arg == "--resume" and i + 1 < len(args) else None)
        if value is not None and value.startswith("gs://"):
            return value
    return None


def main(argv: Sequence[str]) -> int:
    """``python -m orchestrator ... --detach``: check, upload, start the controller, print how
    to follow. Exit 0 when the controller VM was created, 2 for a config error (one line)."""
    args = [a for a in argv[1:] if a != FLAG]
    sweep = detached_resume(argv)
    if sweep is not None:  # the controller died: go on here, or on a new one with --detach
        from orchestrator.controller.__main__ import main as controller_main

        return controller_main(["resume", sweep, *([FLAG] if FLAG in argv[1:] else [])])
    if any(a.startswith("--resume") for a in args):
        print(f"config error: {FLAG}: --resume {FLAG} takes a detached sweep's gs:// URL; "
              "a local folder is resumed here, without --detach", file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    stage: dict[str, str] = {}
    try:
        return _submit(args, stage)
    except ConfigError as err:
        print(err.line(), file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    except ProvisionError as err:  # the cloud refused the controller: nothing runs
        print(f"controller: not created: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if "vm" in stage:  # the insert may have reached the cloud: the sweep may be running
            print(f"interrupted while creating controller VM {stage['vm']}: it may run the "
                  f"sweep; python -m orchestrator.controller status {stage['sweep']} says, "
                  "cancel stops it", file=sys.stderr)
        else:
            print("interrupted: no controller VM was created", file=sys.stderr)
        return EXIT_INTERRUPTED


def first_point(overrides: Sequence[str]) -> list[str]:
    """The overrides of the sweep's first point (each sweep override's first value): what one
    composition checks the provider section on."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    out = []
    for text, override in zip(overrides, parsed, strict=True):
        if override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()))
            out.append(f"{override.get_key_element()}={first}")
        else:
            out.append(text)
    return out


def _submit(args: list[str], stage: dict[str, str]) -> int:
    import subprocess

    from omegaconf import OmegaConf

    from orchestrator.config.compose import compose_config
    from orchestrator.plan.load import load_and_plan

    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    cfg = compose_config(first_point(overrides))
    experiment, plan = load_and_plan(cfg)
    provider = experiment.provider
    if provider.name != "gce":
        raise ConfigError("provider", f"{FLAG} runs the sweep on a controller VM in Google "
                          f"Cloud: it needs provider=gce (not {provider.name})")
    storage = getattr(provider, "storage", None)
    if not storage:
        raise ConfigError("provider.storage", f"{FLAG} keeps the sweep's state in Cloud Storage,"
                          " where the controller and this machine both reach it: set "
                          "provider.storage=gs://BUCKET/PREFIX")
    from provisioning.gce.config import controller_problems

    for field, problem in controller_problems(provider, experiment.pricing):
        # its cost belongs in the plan and the summary
        raise ConfigError(field, f"{FLAG} prices its controller VM: {problem}")
    folder_key = "hydra.sweep.dir=" if is_sweep(flags) else "hydra.run.dir="
    sweep_dir = next((a.split("=", 1)[1] for a in overrides if a.startswith(folder_key)), None)
    sweep_id, sweep_dir = _sweep_names(str(cfg.get("name") or "sweep"), sweep_dir,
                                       is_sweep(flags))
    urls = layout.SweepUrls(storage, sweep_id)

    zones = controller_zones(provider, [h.zone for h in plan.hosts])
    zone = zones[0]
    hourly = _controller_price(experiment, provider.controller_machine_type, zone)
    points = _points(overrides)
    life_s = min(CONTROLLER_MAX_S, points * (provider.run_duration_s() or CONTROLLER_MAX_S))

    # 1. every point, as the attached command would check it: nothing is created yet
    with tempfile.TemporaryDirectory(prefix="transient-detach-") as tmp:
        check = subprocess.run([sys.executable, "-m", "orchestrator", *flags, *overrides,
                                "dry_run=true", "progress=false",
                                f"hydra.sweep.dir={tmp}/sweep", f"hydra.run.dir={tmp}/run"])
        if check.returncode != 0:
            return check.returncode
    account_fits = _check_account(provider)
    print(f"controller: 1 on-demand {provider.controller_machine_type} in {zone}, "
          f"{_price_text(hourly, provider.controller_machine_type)} while the sweep runs "
          f"({points} point(s); the cloud ends it after "
          f"{life_s / 3600:.0f} h at most); state in {urls.root}")
    for line in account_fits:
        print(f"controller: {line}")
    if experiment.dry_run:
        return 0
    if experiment.preflight:
        from orchestrator.preflight import PreflightError, run_preflight

        try:
            run_preflight(experiment)
        except PreflightError as err:
            print(str(err), file=sys.stderr)
            return 1

    # 2. what the controller needs, in the bucket
    from orchestrator.version import tool_version
    from provisioning.gce.api import ComputeApi, resolve_credentials
    from provisioning.gce.controller import (
        controller_body,
        controller_vm_name,
        create_controller,
        tool_wheel,
    )
    from provisioning.gce.keys import public_key_line
    from provisioning.gce.storage import GcsStore, GcsUrl

    _, project = resolve_credentials(provider)
    project = provider.project or project
    store = GcsStore(cfg=provider)
    kept = [a for a in overrides if not a.startswith(_LOCAL_ONLY)]
    sent: dict[str, int] = {}  # what crosses this machine's link, by what it is
    data_dir = experiment.job.data_dir
    if data_dir and not str(data_dir).startswith("gs://"):
        folder = Path(data_dir).expanduser()
        store.upload(folder, GcsUrl.parse(urls.data))
        sent["data"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        kept.append(f"job.data_dir={urls.data}")
    elif data_dir:
        kept.append(f"job.data_dir={data_dir}")
    vm = controller_vm_name(sweep_id)
    # the controller acts as its service account (ADC on a VM), never with the user's key file
    from provisioning.gce.config import CREDENTIALS_ADC, CREDENTIALS_ANONYMOUS

    creds = (CREDENTIALS_ANONYMOUS if provider.credentials == CREDENTIALS_ANONYMOUS
             else CREDENTIALS_ADC)
    section = {**OmegaConf.to_container(cfg.provider, resolve=True), "credentials": creds,
               "ssh_key": None, "project": project}
    command = layout.Command(
        sweep_id=sweep_id,
        overrides=[*flags, *kept, f"provider.project={project}", f"provider.credentials={creds}",
                   "provider.ssh_key=null", "preflight=false"],
        sweep_dir=sweep_dir, provider=section,
        env={k: os.environ[k] for k in STAND_IN_ENV if os.environ.get(k)},
        submitted_by=f"{getpass.getuser()}@{socket.gethostname()}", submitted_at=time.time(),
        controller_vm=vm, controller_zone=zone, controller_usd_per_hour=hourly,
        version=tool_version())
    with tempfile.TemporaryDirectory(prefix="transient-detach-") as tmp:
        wheel = tool_wheel(Path(tmp))  # None: an installed tool, the same version installs
        if wheel is not None:
            command.wheel = wheel.name
            store.upload(wheel.parent, GcsUrl.parse(urls.submit), [wheel.name])
            sent["this tool's wheel"] = wheel.stat().st_size
    archive = repo_archive()
    sent["your experiments and conf"] = len(archive)
    store.write_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.REPO_ARCHIVE)), archive)
    store.write_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.COMMAND_FILE)),
                      command.to_json().encode())
    store.write_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)),
                      layout.ControllerState(layout.SUBMITTED, time.time(), vm=vm,
                                             zone=zone).to_json().encode())

    # 3. the controller VM: on-demand, its own service account, a life the cloud bounds; in
    # the cluster's zone, else the next of provider.zones that has the capacity
    from orchestrator.controller import index
    from provisioning.gce.errors import ZoneCapacityError

    api = ComputeApi(provider, project=project)
    key = public_key_line(provider.ssh_key_path()) if provider.ssh_key else None
    index.remember(urls, Path.cwd())  # known by id from here on, whatever happens next
    stage.update(vm=vm, sweep=sweep_id)
    for attempt, zone in enumerate(zones):
        body = controller_body(provider, project, zone, vm, urls.root, key, command.env,
                               int(life_s))
        try:
            create_controller(api, zone, body, provider.operation_timeout_s)
            break
        except ZoneCapacityError as error:
            if attempt == len(zones) - 1:
                raise ConfigError("provider.controller_zone", f"no zone of {', '.join(zones)} "
                                  f"could create the controller VM ({error}); name one with "
                                  "provider.controller_zone") from None
            print(f"controller: {zone} has no capacity for it; trying {zones[attempt + 1]}")
    if zone != command.controller_zone:  # the agent renews and deletes the VM where it is
        command.controller_zone = zone
        store.write_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.COMMAND_FILE)),
                          command.to_json().encode())
        store.write_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)),
                          layout.ControllerState(layout.SUBMITTED, time.time(), vm=vm,
                                                 zone=zone).to_json().encode())
    follow = f"python -m orchestrator.controller {{}} {sweep_id}"
    print(f"uploaded {_size(sum(sent.values()))} to {urls.root} ("
          + ", ".join(f"{what} {_size(n)}" for what, n in sent.items())
          + "): all that crosses this machine's link; the VMs read the data from the bucket")
    print(f"detached: sweep {sweep_id} runs on controller VM {vm} ({zone}, "
          f"{provider.controller_machine_type}, "
          f"{_price_text(hourly, provider.controller_machine_type)}), its state in {urls.root}")
    for verb, what in (("status", "points, steps and cost so far"),
                       ("attach", "the live progress (Ctrl-C detaches; the sweep goes on)"),
                       ("logs -f", "the console"), ("cancel", "stop it and release every VM"),
                       ("pull", f"the results into {sweep_dir}")):
        print(f"  {follow.format(verb):<60} {what}")
    return 0


def controller_zones(provider: Any, plan_zones: Sequence[str | None]) -> list[str]:
    """Where the controller may go, in order: `provider.controller_zone` alone when set; else
    the cluster's zone (its first host's), then the other `provider.zones` of that region, then
    the rest of them (beside its cluster, where a stock-out of GPUs rarely touches a small
    CPU machine, but not lost to one)."""
    if provider.controller_zone:
        return [provider.controller_zone]
    from provisioning.catalog import region_of

    first = next((z for z in plan_zones if z), None) or provider.zones[0]
    rest = [z for z in provider.zones if z != first]
    same = [z for z in rest if region_of(z) == region_of(first)]
    return [first, *same, *[z for z in rest if z not in same]]


def _check_account(provider: Any) -> list[str]:
    """The controller's service account may do what the sweep needs (create and delete VMs,
    act as the VMs' account, write the bucket): the lines that fit; ConfigError for the first
    that does not (`provisioning/gce/access.py`). Skipped with `provider.preflight_checks`."""
    if not provider.preflight_checks:
        return ["its account's roles not checked (provider.preflight_checks=false)"]
    from provisioning.gce.access import controller_account_lines
    from provisioning.gce.api import ComputeApi, resolve_credentials

    _, project = resolve_credentials(provider)
    api = ComputeApi(provider, project=provider.project or project)
    fits, short = controller_account_lines(api, provider, api.project_info().default_service_account)
    if short:
        field, _, problem = short[0].partition(": ")
        raise ConfigError(field, problem)
    return fits


def _price_text(hourly: float, machine_type: str) -> str:
    """The controller's price per hour, or that the catalog has none (never a silent $0)."""
    if hourly > 0:
        return f"about ${hourly:.3f}/h"
    return (f"price unknown: the pricing catalog has no {machine_type} (machine_types of "
            "conf/pricing/gce.yaml); its cost is counted as $0")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.0f} kB"


def _sweep_names(name: str, sweep_dir: str | None, sweep: bool = True) -> tuple[str, str]:
    """(sweep id, result folder relative to the command's folder). The folder is
    ``multirun/<name>/<stamp>-<hex>`` (one run: ``outputs/...``) unless the command names
    one, and the id is what
    :func:`orchestrator.sweep.sweep_id` makes of that folder: the ``sweep-id`` label of every
    VM the sweep creates is then the detached sweep's id."""
    if sweep_dir is None:
        sweep_id = layout.new_sweep_id(name)
        slug = sweep_id.rsplit("-", 3)[0]
        top = "multirun" if sweep else "outputs"
        return sweep_id, f"{top}/{slug}/{sweep_id[len(slug) + 1:]}"
    from provisioning.gce.body import label_value

    path = Path(sweep_dir)
    sweep_id = label_value(f"{path.parent.name}-{path.name}")
    problem = layout.sweep_id_problem(sweep_id)
    if problem:
        raise ConfigError("hydra.sweep.dir", f"{sweep_dir}: names the detached sweep, and "
                          f"{problem}")
    return sweep_id, sweep_dir


def _points(overrides: Sequence[str]) -> int:
    """How many points the sweep has (the product of its sweep overrides' lengths)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    count = 1
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_sweep_override():
            count *= len(list(override.sweep_string_iterator()))
    return count


def _controller_price(experiment: Any, machine_type: str, zone: str) -> float:
    """The controller VM's on-demand price per hour from the catalog (0.0 when it has none)."""
    try:
        return float(experiment.pricing.hourly_price(machine_type, None, False, zone=zone))
    except Exception:  # a machine type the catalog does not price: the plan says so
        return 0.0


def repo_archive(root: Path | None = None) -> bytes:
    """The user repository's ``experiments/`` and ``conf/`` (only those: the controller needs
    nothing else of it) as a gzip'd tar; empty when the command runs outside a repository."""
    from orchestrator import user_repo

    root = root or user_repo.user_root()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for part in (user_repo.EXPERIMENTS, user_repo.CONF):
            if root is not None and (root / part).is_dir():
                tar.add(root / part, arcname=part)
    return buffer.getvalue()
