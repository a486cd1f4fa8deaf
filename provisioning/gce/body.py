"""The REST body of one VM: machine type, GPUs, Spot scheduling, labels and boot metadata.

Pure functions over plain dicts (REST field names, gce-notes.md §A1), so the dry run can show
what would be created without the cloud SDK; `compute_v1.Instance.from_json` takes them as is.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from provisioning.base import PREEMPTION_NOTICE_FILE, BadRequestError
from provisioning.gce.config import TOOL_LABEL, GceConfig
from provisioning.machine_shapes import BUILT_IN_GPUS, FIXED_GPU_SHAPES, TABLED_FAMILIES
from trainer.gcs import METADATA_URL  # the VM-side dataset download asks it too

#: Catalog GPU name -> GCE accelerator type attached to N1 machine types.
ATTACHED_GPUS = {"t4": "nvidia-tesla-t4", "v100": "nvidia-tesla-v100",
                 "p100": "nvidia-tesla-p100", "p4": "nvidia-tesla-p4",
                 "k80": "nvidia-tesla-k80"}
#: Spot VMs get 30 s between ACPI soft-off and power-off (gce-notes §A3); without
#: preemptionNoticeDuration the metadata flip is the only warning, and it comes WITH the soft-off:
#: systemd is already stopping sshd and the session, so the notice is best-effort.
SPOT_SHUTDOWN_WINDOW_S = 30
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")


def label_value(text: str) -> str:
    """A GCE label value: lowercase letters, digits, `_` and `-`, at most 63 characters."""
    return _LABEL_BAD.sub("-", text.lower())[:63]


def vm_name(run_id: str, slot: str, serial: int) -> str:
    """`tp-<run>-<slot>-<serial>`: unique per creation, ≤ 63 chars, `[a-z]([-a-z0-9]*[a-z0-9])?`."""
    tail = f"-{label_value(slot).replace('_', '-')}-{serial}"
    run = label_value(run_id).replace("_", "-").strip("-")
    return f"tp-{run}"[: 63 - len(tail)].rstrip("-") + tail


def built_in_gpu(machine_type: str) -> tuple[str, int] | None:
    """(catalog GPU, GPUs per VM) built into `machine_type`, None for a type without one (N1,
    E2...). Raises BadRequestError for a shape its series does not have (`g2-standard-5`)."""
    shape = FIXED_GPU_SHAPES.get(machine_type)
    if shape is not None:
        return shape
    family = machine_type.split("-", 1)[0]
    if family in TABLED_FAMILIES:
        known = sorted(m for m in FIXED_GPU_SHAPES if m.startswith(f"{family}-"))
        raise BadRequestError(f"machine type {machine_type} does not exist (the {family.upper()} "
                              f"series: {', '.join(known)})")
    return (BUILT_IN_GPUS[family], 1) if family in BUILT_IN_GPUS else None


def accelerators(machine_type: str, gpu: str | None, count: int = 1) -> list[dict[str, object]]:
    """`guestAccelerators` entries short of the zone URL prefix: attached GPUs for N1 machine
    types, none for series with built-in GPUs. The one place that says which machine type takes
    which GPU (planner, validation, dry run and provider ask it). Raises BadRequestError for a
    mismatch."""
    family = machine_type.split("-", 1)[0]
    fixed = built_in_gpu(machine_type)
    if fixed is not None:
        built_in = fixed[0]
        if gpu not in (None, built_in):
            raise BadRequestError(f"machine type {machine_type} has a built-in {built_in} GPU, "
                                  f"not {gpu}")
        return []
    if gpu is None:
        return []
    if gpu not in ATTACHED_GPUS:
        families = sorted({f for f, g in BUILT_IN_GPUS.items() if g == gpu}
                          | {m.split("-", 1)[0] for m, (g, _) in FIXED_GPU_SHAPES.items()
                             if g == gpu})
        hint = f"use a {'/'.join(families)}-* machine type" if families else "not on GCE"
        raise BadRequestError(f"GPU {gpu} cannot be attached to {machine_type} ({hint})")
    if family != "n1":
        raise BadRequestError(f"GPU {gpu} attaches to N1 machine types only (got {machine_type})")
    return [{"acceleratorType": ATTACHED_GPUS[gpu], "acceleratorCount": count}]


def has_gpu(machine_type: str, gpu: str | None) -> bool:
    """True when a VM of this type (with `gpu` attached) has a GPU."""
    return gpu is not None or machine_type.split("-", 1)[0] in BUILT_IN_GPUS


@dataclass(frozen=True)
class VmRequest:
    """One VM to create: where, what, and which trainer hosts it carries."""

    name: str
    zone: str
    machine_type: str
    gpu: str | None
    transient: bool
    labels: Mapping[str, str]
    host_ids: Sequence[str]  # trainer hosts on this VM (colocated roles share it); [0] = machine
    network_ip: str | None = None  # pin the internal IP (a replacement keeps its slot's address)


def remote_workdir(cfg: GceConfig, run_id: str, machine_id: str) -> str:
    """The work dir on a VM, shared by the hosts on it (`Host.machine` names the VM's first)."""
    return f"{cfg.remote_root}/{run_id}/hosts/{machine_id}"


def notice_path(cfg: GceConfig, run_id: str, machine_id: str) -> str:
    """Where the trainers on a VM read their preemption notice (provisioning/base.py)."""
    return f"{remote_workdir(cfg, run_id, machine_id)}/{PREEMPTION_NOTICE_FILE}"


def watcher_script(notices: Mapping[str, str], owner: str,
                   grace_s: int = SPOT_SHUTDOWN_WINDOW_S) -> str:
    """Bash that long-polls the metadata server's `instance/preempted` and, when it flips to
    TRUE, writes each preemption notice (`notices`: host id -> file; JSON `{"host_id",
    "deadline"}`) atomically. Reads the current value first, then waits with its ETag, so a flip between two
    requests is not missed (gce-notes §A3). `TRANSIENT_METADATA_URL` overrides the server (tests).
    """
    pairs = " ".join(f"{shlex.quote(h)}={shlex.quote(p)}" for h, p in notices.items())
    return f"""#!/bin/bash
# transient-ps: preemption watcher (writes the notice file the trainer polls)
MD="${{TRANSIENT_METADATA_URL:-{METADATA_URL}}}"
etag=NONE
while true; do
  if [ "$etag" = NONE ]; then q=""; else q="?wait_for_change=true&timeout_sec=300&last_etag=$etag"; fi
  headers=$(mktemp)
  value=$(curl -sf -D "$headers" -H 'Metadata-Flavor: Google' "$MD/instance/preempted$q") \\
    || {{ rm -f "$headers"; sleep 1; continue; }}
  etag=$(tr -d '\\r' < "$headers" | awk 'tolower($1)=="etag:" {{print $2}}')
  rm -f "$headers"
  [ -n "$etag" ] || etag=NONE
  if [ "$value" = TRUE ]; then
    deadline=$(( $(date +%s) + {grace_s} ))
    for pair in {pairs}; do
      host="${{pair%%=*}}"; file="${{pair#*=}}"
      mkdir -p "$(dirname "$file")"
      printf '{{"host_id": "%s", "deadline": %s}}\\n' "$host" "$deadline" > "$file.tmp"
      mv "$file.tmp" "$file"
      chown -R {shlex.quote(owner)} "$(dirname "$file")" 2>/dev/null || true
    done
    exit 0
  fi
done
"""


#: Instance metadata key holding the lease's renewal stamp: the orchestrator writes its own
#: clock's expiry there (readable in the console), but the VM treats it as opaque: only a
#: CHANGE of the value counts as a renewal (`lease_watcher_script`), so a skewed orchestrator
#: clock (a laptop minutes off after sleep) can neither end healthy VMs nor keep dead ones.
LEASE_KEY = "transient-lease-expires"
#: Instance metadata key holding the lease's length in whole seconds: the VM ends itself this
#: long after the last change of LEASE_KEY it saw, measured on its own monotonic clock.
LEASE_S_KEY = "transient-lease-s"
COMPUTE_URL = "https://compute.googleapis.com/compute/v1"
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"
#: Read objects only: what a VM needs to download a dataset staged in `provider.storage`.
STORAGE_READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"


def lease_value(expires: float) -> str:
    """The lease stamp's metadata value: whole seconds, rounded up. Renewals are at least a
    second apart (`lease_s / 3`), so each one changes the value, which is all the VM reads."""
    return str(math.ceil(expires))


def lease_seconds(lease_s: float) -> str:
    """LEASE_S_KEY's value: whole seconds, rounded up (rounding never shortens a lease)."""
    return str(math.ceil(lease_s))


def lease_watcher_script(poll_s: int = 30) -> str:
    """Bash that ends the VM when the orchestrator stopped renewing its lease (the orchestrator
    was killed, its machine slept, its network is gone): every `poll_s` it reads the stamp
    `instance/attributes/transient-lease-expires` and notes, on the VM's own monotonic clock
    (`/proc/uptime`, which neither NTP nor the orchestrator's clock moves), when the value last
    changed. Once `transient-lease-s` has passed since then, it asks the Compute API to delete
    this VM with the VM's own service-account token, and powers the VM off if that is not
    possible (the account may not delete VMs: a stopped VM bills its disk only). Two machines'
    clocks are never compared. `TRANSIENT_METADATA_URL` / `TRANSIENT_COMPUTE_URL` override the
    servers and `TRANSIENT_POWEROFF` the power-off command (tests: never the test machine's)."""
    return f"""#!/bin/bash
# transient-ps: lease watcher (the VM ends itself when the orchestrator is gone)
MD="${{TRANSIENT_METADATA_URL:-{METADATA_URL}}}"
API="${{TRANSIENT_COMPUTE_URL:-{COMPUTE_URL}}}"
H='Metadata-Flavor: Google'
now_cs() {{  # centiseconds since boot: monotonic, unlike date +%s
  local up rest
  if read -r up rest < /proc/uptime 2>/dev/null; then echo $(( 10#${{up/./}} ))
  else echo $(( $(date +%s) * 100 )); fi
}}
last=""; seen=0
while true; do
  stamp=$(curl -sf -H "$H" "$MD/instance/attributes/{LEASE_KEY}")
  lease=$(curl -sf -H "$H" "$MD/instance/attributes/{LEASE_S_KEY}")
  now=$(now_cs)
  if [ -n "$stamp" ] && [ "$stamp" != "$last" ]; then last="$stamp"; seen=$now; fi
  if [ -n "$last" ] && [ -n "$lease" ] && [ $(( now - seen )) -ge $(( ${{lease%%.*}} * 100 )) ]; then
    token=$(curl -sf -H "$H" "$MD/instance/service-accounts/default/token" \\
      | sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p')
    name=$(curl -sf -H "$H" "$MD/instance/name")
    zone=$(curl -sf -H "$H" "$MD/instance/zone"); zone="${{zone##*/}}"
    project=$(curl -sf -H "$H" "$MD/project/project-id")
    if [ -n "$token" ] && curl -sf -X DELETE -H "Authorization: Bearer $token" \\
        "$API/projects/$project/zones/$zone/instances/$name" >/dev/null; then
      exit 0
    fi
    ${{TRANSIENT_POWEROFF:-shutdown -h now}}
    exit 0
  fi
  sleep {poll_s}
done
"""


#: Guest-attribute namespace where a GPU VM's startup script says what nvidia-smi sees: key
#: `gpus`, value the GPU count, or "0: <nvidia-smi's message>" (`GceProvider` reads it).
GPU_NAMESPACE = "transient-gpu"


def gpu_check_script(wait_s: int = 600) -> str:
    """Bash for GPU VMs: wait (a driverless DLVM image installs the driver on first boot) for
    `nvidia-smi -L` to list a GPU, at most `wait_s`, then publish the count or the last error
    as guest attribute `transient-gpu/gpus`, so the orchestrator fails fast on a VM that would
    otherwise train on its CPU."""
    return f"""#!/bin/bash
# transient-ps: GPU check (publishes what nvidia-smi sees as a guest attribute)
MD="${{TRANSIENT_METADATA_URL:-{METADATA_URL}}}"
end=$(( $(date +%s) + {wait_s} ))
while true; do
  out=$(nvidia-smi -L 2>&1)
  count=$(printf '%s\\n' "$out" | grep -c '^GPU ')
  if [ "$count" -gt 0 ] || [ "$(date +%s)" -ge "$end" ]; then break; fi
  sleep 10
done
if [ "$count" -gt 0 ]; then value="$count"; else value="0: $(printf '%s' "$out" | tr '\\n' ' ' | cut -c1-300)"; fi
curl -sf -X PUT --data "$value" -H 'Metadata-Flavor: Google' \
  "$MD/instance/guest-attributes/{GPU_NAMESPACE}/gpus"
"""


def startup_script(watcher: str, remote_root: str, lease_watcher: str | None = None,
                   gpu_check: str | None = None) -> str:
    """The VM's `startup-script`: install the watchers and run them detached from the script
    (as systemd units where possible, so the startup-script service finishing does not kill
    them)."""
    scripts = [("preemption-watcher", watcher)]
    if lease_watcher is not None:
        scripts.append(("lease-watcher", lease_watcher))
    if gpu_check is not None:
        scripts.append(("gpu-check", gpu_check))
    lines = ["#!/bin/bash",
             f"mkdir -p {shlex.quote(remote_root)} && chmod 1777 {shlex.quote(remote_root)}"]
    for unit, text in scripts:
        path = shlex.quote(f"{remote_root}/{unit}.sh")
        lines += [f"cat > {path} <<'TRANSIENT_WATCHER'", text + "TRANSIENT_WATCHER",
                  f"chmod +x {path}",
                  # systemd-run fails where systemd is not PID 1 (a container image):
                  # the watcher then runs detached by hand rather than not at all
                  f"systemd-run --unit=transient-{unit} {path} 2>/dev/null"
                  f" || {{ setsid nohup {path} >/dev/null 2>&1 < /dev/null & }}"]
    return "\n".join(lines) + "\n"


def base_body(cfg: GceConfig, name: str, zone: str, machine_type: str,
              labels: Mapping[str, str], metadata: list[dict[str, str]],
              network_ip: str | None = None) -> dict[str, object]:
    """What every VM of this tool shares (a run's host or a sweep's controller): its name,
    machine type, labels (`provider.labels` first), firewall tags, boot disk from
    `provider.image` or the image family, network interface and metadata.

    Labels go in as given: `provider.labels` were checked against Compute Engine's rules before
    anything was provisioned (config.py `labels_problems`: used as typed, so a filter on them
    finds the VM), and the tool's own `labels` are built in label form (`run_labels` tidies the
    run, role and host ids; a sweep id is a label value by construction,
    orchestrator/controller/layout.py `sweep_id_problem`)."""
    source_image = cfg.image or (f"projects/{cfg.image_project}/global/images/family/"
                                 f"{cfg.image_family}")
    nic: dict[str, object] = {"network": cfg.network}
    if cfg.subnetwork:
        nic["subnetwork"] = cfg.subnetwork
    if network_ip:
        nic["networkIP"] = network_ip
    if cfg.external_ip:
        nic["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    return {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine_type}",
        "labels": {**cfg.labels, **labels},
        "tags": {"items": list(cfg.tags)},
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": source_image, "diskSizeGb": str(cfg.boot_disk_gb),
            "diskType": f"zones/{zone}/diskTypes/{cfg.boot_disk_type}"}}],
        "networkInterfaces": [nic],
        "metadata": {"items": metadata},
    }


def instance_body(cfg: GceConfig, project: str, vm: VmRequest, run_id: str,
                  ssh_public_key: str, lease_expires: float | None = None) -> dict[str, object]:
    """The REST `Instance` for `vm` (gce-notes §A1, §C). `lease_expires` (unix time): the
    VM's first lease; None: no lease watcher."""
    zone = vm.zone
    accs = [{**a, "acceleratorType": f"projects/{project}/zones/{zone}/acceleratorTypes/"
             f"{a['acceleratorType']}"} for a in accelerators(vm.machine_type, vm.gpu)]
    gpu_vm = has_gpu(vm.machine_type, vm.gpu)
    scheduling: dict[str, object] = {}
    if vm.transient:
        scheduling = {"provisioningModel": "SPOT",
                      "instanceTerminationAction": str(cfg.termination_action),
                      "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    elif gpu_vm:  # GPU VMs cannot live-migrate
        scheduling = {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
    limit = cfg.run_duration_s()  # every VM, the PS included: a life the cloud enforces
    if limit:
        scheduling["maxRunDuration"] = {"seconds": str(limit)}
        scheduling.setdefault("instanceTerminationAction", "DELETE")
    machine = vm.host_ids[0]
    watcher = watcher_script({machine: notice_path(cfg, run_id, machine)}, cfg.ssh_user)
    metadata = [
        {"key": "ssh-keys", "value": f"{cfg.ssh_user}:{ssh_public_key.strip()}"},
        {"key": "enable-guest-attributes", "value": "TRUE"},
        {"key": "startup-script", "value": startup_script(
            watcher, cfg.remote_root,
            lease_watcher_script() if lease_expires is not None else None,
            gpu_check_script(int(cfg.gpu_timeout_s)) if gpu_vm and cfg.gpu_check else None)},
    ]
    if lease_expires is not None:
        metadata += [{"key": LEASE_KEY, "value": lease_value(lease_expires)},
                     {"key": LEASE_S_KEY, "value": lease_seconds(cfg.lease_s)}]
    if gpu_vm:
        metadata.append({"key": "install-nvidia-driver", "value": "True"})
    body = base_body(cfg, vm.name, zone, vm.machine_type, vm.labels, metadata, vm.network_ip)
    # Least privilege for the default account: the VM's token lets its lease watcher delete
    # the VM itself, and with `storage` set read objects (a dataset staged there, `python -m
    # trainer data fetch-gcs`); nothing else on a VM calls a Google API. Neither: no account.
    default_scopes = [*([COMPUTE_SCOPE] if lease_expires is not None else []),
                      *([STORAGE_READ_SCOPE] if cfg.storage else [])]
    if cfg.service_account:
        body["serviceAccounts"] = [{"email": cfg.service_account, "scopes": list(cfg.scopes)}]
    elif default_scopes:
        body["serviceAccounts"] = [{"email": "default", "scopes": default_scopes}]
    if accs:
        body["guestAccelerators"] = accs
    if scheduling:
        body["scheduling"] = scheduling
    return body


def run_labels(run_id: str, sweep_id: str | None, role: str, host_id: str,
               owner: Mapping[str, str]) -> dict[str, str]:
    """The labels that find a VM again: tool, run, sweep, role(s), host and the owner process."""
    labels = {"tool": TOOL_LABEL, "run-id": label_value(run_id), "role": label_value(role),
              "host-id": label_value(host_id), **{k: label_value(v) for k, v in owner.items()}}
    if sweep_id:
        labels["sweep-id"] = label_value(sweep_id)
    return labels
