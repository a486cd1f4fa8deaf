"""The controller VM of a detached sweep (`--detach`, orchestrator/controller/): its body, the
startup script that installs the tool on it, and this tool's wheel that the script installs.

The controller is one small on-demand VM without a GPU (`provider.controller_machine_type`)
that runs the orchestrator instead of the user's machine. It gets nothing of the user's but
what is in the sweep's folder of the bucket (`orchestrator/controller/layout.py`): its identity
is its service account (`provider.service_account`, else the project's default compute account
with the `cloud-platform` scope, because it creates and deletes the sweep's VMs, sets their
lease, and reads and writes the bucket), and it logs into the workers with a key it makes.

Its `startup-script` (run as root at every boot by the guest agent) writes three files and runs
the last with the image's own `python3`, which needs no Google library, no gsutil and no pip:
`gcs.py` (trainer/gcs.py: the bucket with the standard library and the VM's token),
`host_setup.py` (provisioning/ssh/host_setup.py: pip run from its own wheel taken from the
package index, so the image needs neither pip nor ensurepip) and `bootstrap.py` (below). The
bootstrap records `booting` in the sweep's `controller.json`, downloads `submit/command.json` and
the tool's wheel (or, for an installed tool, installs `transient-orchestrator==<version>` from
the index), builds a venv with the tool and its dependencies from `provider.index_url`, and
starts the agent (`python -m orchestrator.controller.agent <sweep URL>`) detached. A failed step
records `failed` with its message, which `status` shows. A later boot of the same VM finds the
venv ready and starts the agent again, which goes on with the sweep from the bucket.

The lease: the body carries the lease stamp and the startup script the workers' lease watcher
(`body.lease_watcher_script`); the agent renews the stamp with every heartbeat, so a controller
VM whose agent died ends itself `provider.lease_s` later. `maxRunDuration` bounds it whatever
happens.
"""

from __future__ import annotations

import inspect
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from provisioning.base import BadRequestError, ProvisionError
from provisioning.gce.body import (
    LEASE_KEY,
    LEASE_S_KEY,
    base_body,
    label_value,
    lease_seconds,
    lease_value,
    lease_watcher_script,
)
from provisioning.gce.config import DEFAULT_SCOPES, TOOL_LABEL, GceConfig

ROLE = "controller"
SWEEP_KEY = "transient-sweep"  # metadata: the sweep's gs:// folder
ENV_KEY = "transient-env"  # metadata: JSON of the stand-in variables (never credentials)
INDEX_KEY = "transient-index-url"  # metadata: where the venv's packages come from
COMMAND_KEY = "transient-controller-command"  # metadata: replaces the agent (tests)
HOME = "/opt/transient-controller"  # the boot files, the venv, the bootstrap's log
LOG = "/var/log/transient-controller.log"
#: The items of a checkout this tool's wheel is built from (pyproject.toml's packages and what
#: they link to: orchestrator/conf -> conf, conf/experiment -> experiments, orchestrator/docs).
WHEEL_ITEMS = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "orchestrator", "trainer",
               "provisioning", "analysis", "hydra_plugins", "conf", "experiments", "docs")


def controller_vm_name(sweep_id: str) -> str:
    """`tc-<sweep id>`: a GCE name (lowercase, digits, `-`, at most 63 characters)."""
    return f"tc-{label_value(sweep_id).replace('_', '-')}"[:63].rstrip("-")


def controller_body(cfg: GceConfig, project: str, zone: str, name: str, sweep_url: str,
                    ssh_public_key: str | None, env: dict[str, str], run_duration_s: int | None,
                    lease_expires: float | None = None) -> dict[str, Any]:
    """The REST `Instance` of the controller VM: on-demand, no GPU, the labels that find it
    again (`tool`, `role=controller`, `sweep-id`), its service account, the metadata the
    bootstrap reads, a life the cloud enforces (`run_duration_s`) and its first lease
    (`lease_expires`, default `provider.lease_s` from now; none with `lease_s` 0)."""
    sweep_id = sweep_url.rstrip("/").rsplit("/", 1)[-1]
    leased = cfg.lease_s > 0
    if leased and lease_expires is None:
        lease_expires = time.time() + cfg.lease_s
    metadata = [
        {"key": SWEEP_KEY, "value": sweep_url},
        {"key": ENV_KEY, "value": json.dumps(env, sort_keys=True)},
        {"key": "enable-guest-attributes", "value": "TRUE"},
        {"key": "startup-script", "value": startup_script(leased)},
    ]
    if cfg.index_url:
        metadata.append({"key": INDEX_KEY, "value": cfg.index_url})
    if ssh_public_key:
        metadata.append({"key": "ssh-keys", "value": f"{cfg.ssh_user}:{ssh_public_key.strip()}"})
    if leased and lease_expires is not None:
        metadata += [{"key": LEASE_KEY, "value": lease_value(lease_expires)},
                     {"key": LEASE_S_KEY, "value": lease_seconds(cfg.lease_s)}]
    scheduling: dict[str, Any] = {"onHostMaintenance": "MIGRATE", "automaticRestart": True}
    if run_duration_s:
        scheduling.update(maxRunDuration={"seconds": str(int(run_duration_s))},
                          instanceTerminationAction="DELETE")
    labels = {"tool": TOOL_LABEL, "role": ROLE, "sweep-id": sweep_id}
    return {
        **base_body(cfg, name, zone, cfg.controller_machine_type, labels, metadata),
        "serviceAccounts": [{"email": cfg.service_account or "default",
                             "scopes": list(cfg.scopes if cfg.service_account
                                            else DEFAULT_SCOPES)}],
        "scheduling": scheduling,
    }


def _source(module: Any) -> str:
    return inspect.getsource(module)


def startup_script(leased: bool = True) -> str:
    """Bash: write the boot files (module docstring), start the lease watcher, run the
    bootstrap with the image's python3."""
    from provisioning.ssh import host_setup
    from trainer import gcs

    files = [("gcs.py", _source(gcs)), ("host_setup.py", _source(host_setup)),
             ("bootstrap.py", BOOTSTRAP)]
    lines = ["#!/bin/bash", f"mkdir -p {HOME}/boot"]
    for name, text in files:
        lines += [f"cat > {HOME}/boot/{name} <<'TRANSIENT_BOOT'", text.rstrip("\n"),
                  "TRANSIENT_BOOT"]
    if leased:
        lines += [f"cat > {HOME}/lease-watcher.sh <<'TRANSIENT_BOOT'",
                  lease_watcher_script().rstrip("\n"), "TRANSIENT_BOOT",
                  f"chmod +x {HOME}/lease-watcher.sh",
                  f"systemd-run --unit=transient-lease-watcher {HOME}/lease-watcher.sh "
                  f"2>/dev/null || {{ setsid nohup {HOME}/lease-watcher.sh >/dev/null 2>&1 "
                  "< /dev/null & }"]
    lines.append(f"python3 {HOME}/boot/bootstrap.py >> {LOG} 2>&1")
    return "\n".join(lines) + "\n"


#: The controller's bootstrap (standard library only; `gcs` and `host_setup` beside it).
BOOTSTRAP = r'''
"""transient-orchestrator: a detached sweep's controller installs the tool and starts its agent
(provisioning/gce/controller.py)."""
import json, os, shlex, subprocess, sys, time, urllib.error, urllib.parse, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gcs  # noqa: E402
import host_setup  # noqa: E402

HOME = "/opt/transient-controller"
MD = (os.environ.get(gcs.METADATA_URL_ENV) or gcs.METADATA_URL).rstrip("/")


def metadata(path):
    request = urllib.request.Request(f"{MD}/{path}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def _headers(root):
    return {"Authorization": f"Bearer {gcs.access_token()}"} if gcs.wants_token(root) else {}


def read(bucket, name):
    root = gcs.storage_root()
    request = urllib.request.Request(gcs.media_url(root, bucket, name), headers=_headers(root))
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return reply.read()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def write(bucket, name, data):
    root = gcs.storage_root()
    url = (f"{root}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?uploadType=media"
           f"&name={urllib.parse.quote(name, safe='')}")
    request = urllib.request.Request(url, data=data, method="POST", headers={
        **_headers(root), "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=60):
        pass


def main():
    sweep = metadata("instance/attributes/transient-sweep")
    env = json.loads(metadata("instance/attributes/transient-env") or "{}")
    os.environ.update(env)
    if env.get("STORAGE_EMULATOR_HOST"):  # a local stand-in of Cloud Storage (tests)
        os.environ.setdefault(gcs.STORAGE_URL_ENV, env["STORAGE_EMULATOR_HOST"])
    bucket, prefix = gcs.split_url(sweep)
    vm = metadata("instance/name") or ""
    zone = (metadata("instance/zone") or "").rsplit("/", 1)[-1]

    def state(phase, message=""):
        record = {"phase": phase, "updated": time.time(), "vm": vm, "zone": zone,
                  "message": message}
        write(bucket, f"{prefix}/controller.json", json.dumps(record).encode())

    def need(name):  # an object of the sweep's folder the user's side uploaded
        data = read(bucket, f"{prefix}/{name}")
        if data is None:
            raise SystemExit(f"{sweep}/{name} is not in the bucket")
        return data

    previous = read(bucket, f"{prefix}/controller.json")
    if previous and json.loads(previous).get("phase") in ("done", "failed", "cancelled"):
        print("the sweep has ended: nothing to start")
        return
    try:
        state("booting", "installing the tool")
        command = json.loads(need("submit/command.json"))
        index = metadata("instance/attributes/transient-index-url") or \
            command["provider"].get("index_url")
        venv = os.path.join(HOME, "venv")
        python = os.path.join(venv, "bin", "python")
        ready = os.path.join(venv, ".transient-ready")
        if not os.path.exists(ready):
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
            pip_wheel = host_setup._index_pip(index, os.path.join(HOME, "pip"),
                                              sys.version_info.minor)
            if pip_wheel is None:
                subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=True)
            if command.get("wheel"):
                target = os.path.join(HOME, command["wheel"])
                with open(target, "wb") as f:
                    f.write(need(f"submit/{command['wheel']}"))
            else:
                target = f"transient-orchestrator=={command['version']}"
            pip = [python, os.path.join(pip_wheel, "pip")] if pip_wheel else [python, "-m", "pip"]
            host = urllib.parse.urlsplit(index)  # an http:// index as host_setup trusts it
            trust = ["--trusted-host", host.hostname] if host.scheme == "http" else []
            done = subprocess.run([*pip, "install", "--no-cache-dir", "--no-input",
                                   "--disable-pip-version-check", "--index-url", index, *trust,
                                   # pip too: the orchestrator builds the hosts' wheel with it
                                   target, "pip"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            print(done.stdout)  # the whole of pip's account, in the bootstrap's log
            if done.returncode != 0:
                lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
                raise SystemExit(f"pip install from {index} failed: "
                                 f"{lines[-1] if lines else done.returncode}")
            open(ready, "w").close()
        custom = metadata("instance/attributes/transient-controller-command")
        argv = shlex.split(custom) if custom else [
            python, "-m", "orchestrator.controller.agent", sweep]
        log = open(os.path.join(HOME, "agent.log"), "ab")
        subprocess.Popen(argv, cwd=HOME, env={**os.environ, "PATH": os.path.dirname(python)
                                              + ":" + os.environ.get("PATH", "")},
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
        print(f"started: {argv}")
    except BaseException as error:
        text = str(error) if isinstance(error, SystemExit) else f"{type(error).__name__}: {error}"
        state("failed", f"controller setup: {text}")
        raise


main()
'''


def create_controller(api: Any, zone: str, body: dict[str, Any], timeout_s: float) -> None:
    """Insert the controller VM and wait until the cloud has created it (its operation DONE);
    an insert retried by the API layer is the same request (its id), never a second VM."""
    operation = api.insert(zone, body, str(uuid.uuid4()))
    api.wait(zone, operation, timeout_s)


def tool_wheel(out_dir: Path) -> Path | None:
    """This tool's wheel, built from the checkout it runs from (a copy of `WHEEL_ITEMS`, so the
    checkout gets no build files); None for an installed tool, whose controller installs the
    same version from the package index instead."""
    from provisioning.checkout import PROJECT_ROOT, is_checkout

    if not is_checkout(PROJECT_ROOT):
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    with tempfile.TemporaryDirectory(prefix="transient-tool-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for item in WHEEL_ITEMS:
            path = PROJECT_ROOT / item
            if path.is_dir():
                shutil.copytree(path, src / item, symlinks=True, ignore=ignore)
            elif path.exists():
                shutil.copy2(path, src / item)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                               "--no-build-isolation", "--wheel-dir", str(out_dir), str(src)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise ProvisionError(f"building this tool's wheel for the controller failed: "
                             f"{done.stderr[-800:]}")
    wheels = sorted(out_dir.glob("transient_orchestrator-*.whl"))
    if not wheels:
        raise BadRequestError(f"building this tool's wheel left none in {out_dir}")
    return wheels[-1]


def shell_words(argv: list[str]) -> str:
    """`argv` as one metadata value (COMMAND_KEY)."""
    return " ".join(shlex.quote(a) for a in argv)
