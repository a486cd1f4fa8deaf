"""The typed configuration of `provider=gce` (the Hydra `provider` group's `gce` option).

A `ProviderConfig` subclass registered with the backend (stored by the registry as `gce_schema`,
named by `conf/provider/gce.yaml`). No Google imports: the dry run and validation read it without
the cloud SDK. Every field is commented in `conf/provider/gce.yaml`; the README's "Running on
Google Cloud" explains them.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from provisioning.base import HostSpec, ProviderConfig
from provisioning.catalog import PricingConfig
from provisioning.host_runtime import DEFAULT_IMAGE_FAMILY
from provisioning.ssh.config import DEFAULT_INDEX_URL, runtime_install_problems

#: The label every VM of this tool carries (`tool=<TOOL_LABEL>`); `orchestrator.gc` (`orphans.py`)
#: finds orphans by it. Label values: lowercase letters, digits, `_` and `-`, at most 63 characters.
TOOL_LABEL = "transient-ps"
#: The label keys this tool sets on its VMs itself (`body.run_labels` with `vm.owner_labels`; a
#: controller's are a subset): a `provider.labels` key among them would be overwritten, and
#: all of them count against Compute Engine's MAX_LABELS per VM.
TOOL_LABEL_KEYS = ("tool", "run-id", "sweep-id", "role", "host-id", "owner-host", "owner-pid",
                   "owner-start")
MAX_LABELS = 64
#: Compute Engine's label rules (gce-notes, `labels`), ASCII only: GCE also takes international
#: lowercase letters, which this tool does not.
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
#: Credentials values that are not a file path.
CREDENTIALS_ADC = "adc"  # Application Default Credentials (gcloud auth application-default login)
CREDENTIALS_ANONYMOUS = "anonymous"  # no auth header: only for a local fake (api_endpoint set)

#: Boot disk size: the DLVM images are 50 GB (their `diskSizeGb`; GCE refuses a smaller disk,
#: the pre-flight says so). On top of the image's own files a VM adds the hosts' venv
#: (TensorFlow with its CUDA wheels, about 6 GB, installed without a pip cache), the run's
#: data and checkpoints (MBs to a few GB). How much of its 50 GB the image itself fills (CUDA
#: toolkit, driver, Docker) is not measured here; a disk that fills fails the setup with pip's
#: or the copy's "No space left on device". 100 GB per VM would spend the usual 500 GB
#: `SSD_TOTAL_GB` of a region on 5 VMs; at 50 GB the 8-worker headline (9 VMs) fits in 450.
DEFAULT_BOOT_DISK_GB = 50
#: Persistent-disk type -> the regional quota its boot disks count against (GCE's quota metrics).
BOOT_DISK_QUOTAS = {"pd-balanced": "SSD_TOTAL_GB", "pd-ssd": "SSD_TOTAL_GB",
                    "pd-standard": "DISKS_TOTAL_GB"}

# Every VM's `maxRunDuration` when `provider.max_run_duration_s` is null: the plan's predicted
# training time x RUN_SAFETY_FACTOR + RUN_SETUP_ALLOWANCE_S, within [RUN_MIN_S, RUN_MAX_S]. The
# factor covers the speed model's error (up to about x2 on a GPU no paper measured) and the
# restarts revocations cost; the allowance covers creating and booting the VMs, installing
# TensorFlow on them and copying the data. It is the backstop of the lease (a VM whose lease
# lapsed ends sooner); a run still going at it loses its VMs, so it errs long.
RUN_SAFETY_FACTOR = 3.0
RUN_SETUP_ALLOWANCE_S = 1800
RUN_MIN_S = 3600  # a short plan still gets an hour: setup alone can take half of it
RUN_MAX_S = 7 * 24 * 3600
RUN_UNKNOWN_S = 24 * 3600  # no prediction (the speed model cannot predict this setup)


class TerminationAction(enum.StrEnum):
    """What GCE does to a preempted Spot VM: DELETE (nothing left to bill) or STOP (disk kept)."""

    DELETE = "DELETE"
    STOP = "STOP"


@dataclass
class GceConfig(ProviderConfig):
    """Everything the GCE backend needs beyond the plan (machine types, GPUs, zones per host)."""

    name: str = "gce"
    project: str | None = None  # GCP project id; None = $GOOGLE_CLOUD_PROJECT at run time
    zones: list[str] = field(default_factory=list)  # fallback order after each host's plan zone
    cross_region: bool = False  # let VMs of one cluster fall back into different regions
    image_project: str = "deeplearning-platform-release"  # where image_family lives
    # CUDA + driver, no framework; Ubuntu 24.04, whose Python 3.12 the hosts' runtime installs on
    image_family: str = DEFAULT_IMAGE_FAMILY
    image: str | None = None  # a custom image URL (projects/P/global/images/NAME); wins if set
    boot_disk_gb: int = DEFAULT_BOOT_DISK_GB  # boot disk size (see DEFAULT_BOOT_DISK_GB)
    boot_disk_type: str = "pd-balanced"  # one of BOOT_DISK_QUOTAS (its regional disk quota)
    network: str = "global/networks/default"  # VPC network
    subnetwork: str | None = None  # regions/R/subnetworks/S for custom-mode VPCs
    tags: list[str] = field(default_factory=lambda: ["transient-ps"])  # firewall target tags
    external_ip: bool = True  # an ephemeral public IP (the orchestrator SSHes to it)
    inside_vpc: bool = False  # the orchestrator runs in the VMs' VPC (reaches internal IPs)
    service_account: str | None = None  # VMs' e-mail; None = the default one, compute scope only,
    #: for the lease watcher (no lease: no account), and storage read with `storage` (datasets)
    scopes: list[str] = field(default_factory=lambda: list(DEFAULT_SCOPES))  # ours; the VMs' too
    #: with service_account
    credentials: str = CREDENTIALS_ADC  # adc | anonymous | path to a service-account key file
    api_endpoint: str | None = None  # Compute API root; None = compute.googleapis.com
    ssh_user: str = "transient"  # login user created by the guest agent from ssh-keys
    os_login_user: str | None = None  # OS Login: whose profile gets the key (e-mail); None =
    #: the credentials' account (user ADC: from token info, `ComputeApi.account_email`)
    ssh_key: str | None = None  # private key (no passphrase); None = the tool's own (keys.py)
    python: str | None = None  # interpreter on the VMs that has the trainer's dependencies
    index_url: str | None = DEFAULT_INDEX_URL  # VMs without `python` install from it themselves
    wheelhouse: str | None = None  # local dir: wheels for VMs without an index (wins if set)
    #: Which TensorFlow build VMs without `python` install: auto = the CUDA build (`gpu` extra)
    #: on VMs with a GPU, the CPU build elsewhere; cpu or gpu = that build on every VM.
    extra: str = "auto"
    termination_action: TerminationAction = TerminationAction.DELETE
    max_run_duration_s: int | None = None  # every VM ends after this (cloud-enforced); None =
    #: derived from the plan (`run_duration_s`), 0 = no limit
    lease_s: float = 900.0  # a VM the orchestrator has not renewed for this long ends itself; 0 = off
    labels: dict[str, str] = field(default_factory=dict)  # added to every VM
    storage: str | None = None  # gs://BUCKET/PREFIX: checkpoints and results of each run there
    remote_root: str = "/var/tmp/transient"  # run dirs on the VMs: <root>/<run_id>/hosts/<id>
    trainer_port: int = 2222  # first gRPC port on a VM; colocated roles take the next ones
    poll_interval_s: float = 5.0  # at most one list call per interval while watching
    ready_poll_s: float = 2.0  # one list call per interval while VMs come up
    operation_timeout_s: float = 300.0  # how long one insert/delete may take
    vm_ready_timeout_s: float = 600.0  # insert until RUNNING, per VM
    host_key_timeout_s: float = 90.0  # wait for the guest agent to publish host keys
    host_key_poll_s: float = 6.0  # guest attributes allow about 10 queries/min per VM
    boot_timeout_s: float = 300.0  # RUNNING until the first SSH login (refusals retried)
    login_grace_s: float = 120.0  # a refused key is retried this long after sshd answers
    unreachable_grace_s: float = 300.0  # SSH lost while GCE says RUNNING: revoked after this
    gpu_check: bool = True  # a GPU VM whose nvidia-smi lists no GPU fails the acquire; its
    #: roles' TensorFlow must see the GPU (`Provider.gpus_checked`, the spec's `gpu_tasks`)
    gpu_timeout_s: float = 600.0  # how long a GPU VM may take to show its GPU (driver install)
    retries: int = 4  # retries of a transient API error (rate limit, 5xx) per request
    retry_backoff_s: float = 2.0  # first backoff; doubles per retry
    not_ready_retry_s: float = 120.0  # delete of a stopping VM / a held internal IP: retried
    boot_preemptions: int = 3  # a VM preempted while booting or checked is re-created this often
    max_parallel: int = 32  # concurrent API calls while creating or deleting
    preflight_checks: bool = True  # quotas, image, bucket, OS Login read before any VM
    #: `--detach`: the sweep runs on one on-demand controller VM of this type (no GPU) in
    #: `controller_zone` (None: the first of `zones`), sharing its state through `storage`
    controller_machine_type: str = "e2-standard-2"
    controller_zone: str | None = None

    def ssh_key_path(self) -> str:
        """The private key the VMs are logged into with: `ssh_key`, or the tool's own."""
        from provisioning.gce.keys import tool_key_path

        return os.path.expanduser(self.ssh_key) if self.ssh_key else str(tool_key_path())

    def check(self) -> list[tuple[str, str]]:
        """(field, problem) known before any VM exists (fields as typed): the hosts' runtime
        install keys, an image family whose Python (its name tells) no wheel of the runtime
        fits, a baked image (`python -m orchestrator.image bake`) made for another dependency
        set, the login key, internal-IP-only VMs, the timeouts, the lease and the labels."""
        from provisioning.host_runtime import image_family_problem, stale_image_problem

        problems = runtime_install_problems(self.index_url, self.wheelhouse, "cpu",
                                            self.python is None)
        if self.extra not in ("auto", "cpu", "gpu"):  # `auto` is GCE's: it knows the VMs' GPUs
            problems.append(("provider.extra", f"{self.extra!r}: must be auto, cpu or gpu"))
        if self.boot_disk_type not in BOOT_DISK_QUOTAS:
            problems.append(("provider.boot_disk_type", f"{self.boot_disk_type!r}: must be one "
                             f"of {', '.join(BOOT_DISK_QUOTAS)}"))
        if self.python is None and self.image is None:
            problem = image_family_problem(self.image_family)
            if problem:
                problems.append(("provider.image_family", problem))
        if self.python is None and self.image is not None:
            problem = stale_image_problem(self.image)
            if problem:
                problems.append(("provider.image", problem))
        if self.ssh_key:
            from provisioning.gce.keys import key_problem

            problem = key_problem(self.ssh_key)
            if problem is not None:
                problems.append(("provider.ssh_key", problem))
        for name in ("boot_timeout_s", "login_grace_s", "vm_ready_timeout_s",
                     "operation_timeout_s"):
            if getattr(self, name) <= 0:
                problems.append((f"provider.{name}", "must be > 0"))
        if not self.external_ip and not self.inside_vpc:
            problems.append(("provider.external_ip", "false leaves the VMs with internal IPs "
                             "only, which the orchestrator cannot reach from outside their VPC: "
                             "keep it true, or run the orchestrator on a VM in that VPC and set "
                             "provider.inside_vpc=true"))
        if self.max_run_duration_s is not None and not (
                self.max_run_duration_s == 0 or 30 <= self.max_run_duration_s <= 120 * 86400):
            problems.append(("provider.max_run_duration_s", f"{self.max_run_duration_s} is "
                             "outside GCE's range (30 s to 120 days); null derives it from the "
                             "plan, 0 sets no limit"))
        if 0 < self.lease_s < 3 * self.poll_interval_s:
            problems.append(("provider.lease_s", f"{self.lease_s:g} s is too short to renew "
                             f"(at least 3 x provider.poll_interval_s; 0 turns the lease off)"))
        elif 0 < self.lease_s < self.unreachable_grace_s:
            problems.append(("provider.lease_s", (
                f"{self.lease_s:g} s is shorter than provider.unreachable_grace_s "
                f"({self.unreachable_grace_s:g} s): the VMs would end themselves during a drop "
                f"of this machine's network that the run waits out; make it at least that")))
        if self.storage:
            problem = storage_url_problem(self.storage)
            if problem:
                problems.append(("provider.storage", problem))
        problem = controller_machine_type_problem(self.controller_machine_type)
        if problem:
            problems.append(("provider.controller_machine_type", problem))
        problems += labels_problems(self.labels)
        return problems

    def check_plan(self, hosts: Sequence[HostSpec], catalog: PricingConfig) -> list[tuple[str, str]]:
        """`provider.zones`: not empty (a host whose plan names no zone takes the first) and
        only zones the catalog knows (the plan's zones are checked against it too)."""
        known = catalog.all_zones()
        if self.controller_zone is not None and self.controller_zone not in known:
            return [("provider.controller_zone", f"unknown zone {self.controller_zone!r} in "
                     f"catalog '{catalog.name}' (one of: {', '.join(known)}; null = the first "
                     "of provider.zones)")]
        if not self.zones:
            return [("provider.zones", "is empty: list the zones VMs may fall back to, in order "
                     f"(e.g. [{known[0] if known else 'us-west1-b'}])")]
        return [(f"provider.zones.{i}", f"unknown zone {zone!r} in catalog '{catalog.name}' "
                 f"(one of: {', '.join(known)})")
                for i, zone in enumerate(self.zones) if zone not in known][:1]

    def contact_grace_s(self) -> float:
        return self.unreachable_grace_s

    def transient_lifetime_cap_s(self) -> float | None:
        """A Spot VM ends at its ``maxRunDuration`` (``instance_body``)."""
        limit = self.run_duration_s()
        return float(limit) if limit else None

    def for_plan(self, predicted_run_s: float | None) -> GceConfig:
        """This config for a plan predicted to train in `predicted_run_s` (None: no
        prediction): `run_duration_s` derives every VM's maxRunDuration from it. The prediction
        is kept beside the fields, not in one (it is no setting)."""
        fitted = replace(self)
        fitted._planned_run_s = predicted_run_s  # type: ignore[attr-defined]
        return fitted

    def run_duration_s(self) -> int | None:
        """Every VM's ``maxRunDuration`` in seconds, None for no limit: the setting when given
        (0: none), else derived from the plan (`for_plan`; RUN_* constants above)."""
        if self.max_run_duration_s is not None:
            return self.max_run_duration_s or None
        return derived_run_duration_s(getattr(self, "_planned_run_s", None))

    def run_duration_basis(self) -> str:
        """Where `run_duration_s` comes from, in words, for the dry run and the log."""
        if self.max_run_duration_s is not None:
            return "provider.max_run_duration_s"
        planned = getattr(self, "_planned_run_s", None)
        if planned is None:
            return ("no predicted train time: the default; provider.max_run_duration_s "
                    "overrides")
        return (f"predicted train time {planned:.0f} s x {RUN_SAFETY_FACTOR:g} + "
                f"{RUN_SETUP_ALLOWANCE_S} s setup, within [{RUN_MIN_S}, {RUN_MAX_S}] s; "
                "provider.max_run_duration_s overrides")


#: A Compute Engine machine type name: lowercase family and parts joined by `-`
#: (e2-standard-2, n2-custom-4-8192, custom-2-4096).
_MACHINE_TYPE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")


def controller_machine_type_problem(machine_type: str) -> str | None:
    """Why `machine_type` cannot be the controller's (it runs only the orchestrator, so a GPU
    shape would bill GPUs for nothing), or None."""
    from provisioning.machine_shapes import BUILT_IN_GPUS, FIXED_GPU_SHAPES

    if not isinstance(machine_type, str) or not _MACHINE_TYPE.fullmatch(machine_type):
        return (f"{machine_type!r} is not a Compute Engine machine type (e.g. e2-standard-2)")
    if machine_type in FIXED_GPU_SHAPES or machine_type.split("-", 1)[0] in BUILT_IN_GPUS:
        return (f"{machine_type!r} has GPUs built in; the controller runs only the "
                "orchestrator: use a machine type without GPUs (e.g. e2-standard-2)")
    return None


def controller_problems(cfg: GceConfig, catalog: PricingConfig) -> list[tuple[str, str]]:
    """(field, problem) of a `--detach` submit's controller VM: its machine type must be priced
    in `catalog` (its cost is in the plan and the summary). Apart from `check_plan` because an
    attached run creates no controller, so an unpriced type is no error there."""
    if cfg.controller_machine_type not in catalog.machine_types:
        return [("provider.controller_machine_type",
                 f"{cfg.controller_machine_type!r} is not priced in catalog '{catalog.name}' "
                 f"(priced: {', '.join(sorted(catalog.machine_types))}); add it to the "
                 "catalog's machine_types or pick a priced one")]
    return []


def from_section(provider: dict) -> GceConfig:
    """A saved provider section (a run's config.yaml, a detached sweep's command.json) as the
    typed config; keys GceConfig does not have are ignored."""
    from dataclasses import fields

    known = {f.name for f in fields(GceConfig) if f.init}
    return GceConfig(**{k: v for k, v in provider.items() if k in known})


def labels_problems(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field, problem) for `provider.labels` that Compute Engine would refuse (a 400 on the
    first VM insert, after the plan and the pre-flight) or that would clash with the tool's own
    labels; values are used as typed, so a VM's labels are exactly the ones a filter names."""
    problems: list[tuple[str, str]] = []
    room = MAX_LABELS - len(TOOL_LABEL_KEYS)
    if len(labels) > room:
        problems.append(("provider.labels", f"{len(labels)} labels, but Compute Engine takes "
                         f"at most {MAX_LABELS} per VM and the tool adds {len(TOOL_LABEL_KEYS)} "
                         f"of its own ({', '.join(TOOL_LABEL_KEYS)}): at most {room}"))
    for key, value in labels.items():
        path = f"provider.labels.{key}"
        if not _LABEL_KEY.fullmatch(key):
            problems.append((path, "label keys must start with a lowercase letter and hold only "
                             "lowercase letters, digits, _ and - (at most 63)"))
        elif key in TOOL_LABEL_KEYS:
            problems.append((path, "the tool sets this label on its VMs itself (it finds them "
                             "by it); pick another key"))
        elif not _LABEL_VALUE.fullmatch(str(value)):
            hint = (" (YAML read a true/false as a boolean: quote it, 'true')"
                    if str(value) in ("True", "False") else "")
            problems.append((path, f"{str(value)!r}: label values hold only lowercase letters, "
                             f"digits, _ and - (at most 63){hint}"))
    return problems


def derived_run_duration_s(predicted_run_s: float | None) -> int:
    """maxRunDuration for a plan predicted to train in `predicted_run_s` (module constants)."""
    if predicted_run_s is None:
        return RUN_UNKNOWN_S
    wanted = predicted_run_s * RUN_SAFETY_FACTOR + RUN_SETUP_ALLOWANCE_S
    return int(min(RUN_MAX_S, max(RUN_MIN_S, wanted)))


#: A Cloud Storage bucket name: 3-63 lowercase letters, digits, `-`, `_` and `.` (up to 222
#: with dots), starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def storage_url_problem(url: str) -> str | None:
    """Why `url` cannot be `provider.storage` (gs://BUCKET or gs://BUCKET/PREFIX), or None."""
    expected = "expected gs://BUCKET/PREFIX, e.g. gs://my-bucket/transient"
    if not url.startswith("gs://"):
        return f"{url!r} is not a Cloud Storage URL ({expected})"
    bucket = url[len("gs://"):].split("/", 1)[0]
    if not _BUCKET.fullmatch(bucket) or ("." not in bucket and len(bucket) > 63):
        return f"{url!r}: {bucket!r} is not a bucket name ({expected})"
    return None
