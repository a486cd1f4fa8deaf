"""A fake Compute Engine v1 REST server for tests and benchmarks, spoken to by the REAL client.

`google.cloud.compute_v1` (REST transport) talks to it with
`ClientOptions(api_endpoint=fake.endpoint)` and `AnonymousCredentials()`. It implements the
surface our GCE backend uses, with the JSON shapes and error placements of the real API
(gce-notes.md §A, §B, §C; platform-notes.md §6):

- instances insert / get / delete / list (AIP-160 label filters) / aggregatedList /
  getGuestAttributes (host keys under `hostkeys/`, only with `enable-guest-attributes`);
- zone operations get / wait (returns early, like the real one) / list (filters);
- PROVISIONING → STAGING → RUNNING on a clock with configurable delays; delete goes through
  STOPPING and then the VM is gone (404);
- a stock-out (`ZONE_RESOURCE_POOL_EXHAUSTED`, 503) and quota errors (`QUOTA_EXCEEDED`, 403, with
  `quotaInfo.metricName`) surface inside the finished insert operation, as they do on GCE; an
  accelerator the zone does not offer is a synchronous 400. Quotas (`set_quota`) count GPUs,
  vCPUs (`CPUS`, `PREEMPTIBLE_CPUS` where granted, `CPUS_ALL_REGIONS`), `IN_USE_ADDRESSES`,
  `GPUS_ALL_REGIONS` and boot disks (`SSD_TOTAL_GB` for pd-balanced/pd-ssd, `DISKS_TOTAL_GB` for
  pd-standard), and are readable with their usage through projects.get / regions.get;
- projects.get also serves `project_metadata` (commonInstanceMetadata: `enable-oslogin`), and
  the OS Login API's `users.importSshPublicKey` (`/v1/users/U:importSshPublicKey`, the real
  `google-cloud-os-login` client pointed at the fake) returns the POSIX user to log in as;
  images.getFromFamily answers a family of `image_catalogue` with its newest non-deprecated
  image (404 once all are deprecated: a retired Deep Learning VM family), others per
  `image_families` (None: every family); images.list lists the catalogue (with filters);
- networks.getEffectiveFirewalls serves `firewalls` (network -> VPC rules; default: the
  `default` network's four rules);
- `request_id` makes a repeated insert return the first operation (idempotency);
- what a first real run hits: `fail_inserts` (503 after the VM was created anyway),
  `preempt_booting` (a Spot VM preempted while PROVISIONING), `not_ready_while_stopping`
  (delete of a VM GCE is stopping answers `resourceNotReady`), `ip_hold_s` (an internal IP
  still in use for a while after its VM is gone);
- `preempt()` (also `POST .../instances/NAME/preempt`) flips the guest-visible `preempted` flag,
  runs the termination action (DELETE: gone; STOP: TERMINATED) and records a
  `compute.instances.preempted` zone operation;
- a per-instance metadata server under `/_metadata/ZONE/NAME/computeMetadata/v1/...` with
  `wait_for_change`/`last_etag`, so the VM-side preemption watcher can run against it, and
  instance name/zone/attributes, project id and a token for the VM-side lease watcher;
- guest attributes `transient-gpu/gpus` of GPU VMs: what nvidia-smi sees (`gpu_driver_ok`);
  `preempt_when_read` preempts a VM when its host keys or GPU check are first asked for;
  `guest_attributes_denied` (403 or 412) refuses every getGuestAttributes, as an organisation
  policy does;
- setMetadata (with the fingerprint check); GCE's `maxRunDuration` and the guests' lease
  watchers are honoured (`_enforce`: a VM is deleted `transient-lease-s` after its lease stamp
  last changed, timed on the fake's clock as the guest times it on its own);
- OS Login and IAM as a locked-down project has them: instances.get's
  `resourceStatus.effectiveInstanceMetadata.enableOsloginMetadataValue` from instance and
  project metadata or an enforcing organisation policy (`oslogin_enforced`); OAuth's token
  endpoint (refresh grant) and `tokeninfo` (the e-mail only for tokens with the e-mail scope);
  IAM `serviceAccounts.get` (the default compute account, which tests may delete), `roles.get`,
  and Resource Manager `projects.getIamPolicy` (`iam_policy`, `iam_policy_denied`);
- `calls` counts API calls per endpoint (what a benchmark of API calls per minute reads).

Stdlib only. Everything happens on 127.0.0.1; nothing leaves the machine.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import itertools
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API = "https://www.googleapis.com/compute/v1"
LEASE_KEY = "transient-lease-expires"  # provisioning.gce.body.LEASE_KEY (the fake stays stdlib)
LEASE_S_KEY = "transient-lease-s"  # provisioning.gce.body.LEASE_S_KEY
GPU_NAMESPACE = "transient-gpu"  # provisioning.gce.body.GPU_NAMESPACE
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")
DEFAULT_ZONES = ("us-central1-a", "us-central1-b", "us-east1-c", "us-west1-b")
#: The real `wait` returns after at most about 2 minutes; the fake's cap is short so the
#: client's bounded wait loop is exercised.
WAIT_CAP_S = 1.0
#: Accelerators every fake zone offers unless told otherwise (K80 was retired on 2024-05-01).
DEFAULT_ACCELERATORS = frozenset({"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100",
                                  "nvidia-l4", "nvidia-tesla-a100"})
_GPU_QUOTA_NAMES = {"nvidia-tesla-t4": "T4", "nvidia-tesla-v100": "V100",
                    "nvidia-tesla-p100": "P100", "nvidia-tesla-p4": "P4", "nvidia-l4": "L4",
                    "nvidia-tesla-a100": "A100", "nvidia-tesla-k80": "K80",
                    "nvidia-a100-80gb": "A100_80GB", "nvidia-h100-80gb": "H100"}
_BUILT_IN_GPUS = {"a2": "nvidia-tesla-a100", "g2": "nvidia-l4", "a3": "nvidia-h100-80gb"}
#: GPUs per VM where a shape has more than one, as GCE's machineTypes list them
#: (https://cloud.google.com/compute/docs/gpus); A2 Ultra carries the 80 GB A100.
_GPU_COUNTS = {"g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8,
               "a2-megagpu-16g": 16, "a3-megagpu-8g": 8, "a3-edgegpu-8g": 8}
_GPU_TYPES = {"a2-ultragpu": "nvidia-a100-80gb", "a3-ultragpu": "nvidia-h200-141gb"}


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


#: The `zone` of global operations (images.insert).
GLOBAL = "global"
DLVM_PROJECT = "deeplearning-platform-release"
#: deprecated.state values that take an image out of images.getFromFamily
_DEPRECATED_STATES = ("DEPRECATED", "OBSOLETE", "DELETED")


def catalogue_image(project: str, name: str, family: str, created: str,
                    deprecated: bool = False, disk_gb: int = 50) -> dict[str, Any]:
    """One public image as images.get/list return it (`created`: YYYY-MM-DD)."""
    image: dict[str, Any] = {
        "kind": "compute#image", "name": name, "family": family, "status": "READY",
        "diskSizeGb": str(disk_gb), "creationTimestamp": f"{created}T00:00:00.000-07:00",
        "selfLink": f"{API}/projects/{project}/global/images/{name}"}
    if deprecated:
        image["deprecated"] = {"state": "DEPRECATED"}
    return image


def default_firewalls() -> dict[str, list[dict[str, Any]]]:
    """The rules an auto-mode `default` network is created with (priority 65534: any rule of
    the project overrides them)."""
    def rule(name: str, ranges: list[str], allowed: list[dict[str, Any]]) -> dict[str, Any]:
        return {"kind": "compute#firewall", "name": name, "network": "global/networks/default",
                "direction": "INGRESS", "priority": 65534, "sourceRanges": ranges,
                "allowed": allowed, "disabled": False}

    return {"default": [
        rule("default-allow-internal", ["10.128.0.0/9"],
             [{"IPProtocol": "tcp", "ports": ["0-65535"]},
              {"IPProtocol": "udp", "ports": ["0-65535"]}, {"IPProtocol": "icmp"}]),
        rule("default-allow-ssh", ["0.0.0.0/0"], [{"IPProtocol": "tcp", "ports": ["22"]}]),
        rule("default-allow-rdp", ["0.0.0.0/0"], [{"IPProtocol": "tcp", "ports": ["3389"]}]),
        rule("default-allow-icmp", ["0.0.0.0/0"], [{"IPProtocol": "icmp"}]),
    ]}


def default_image_catalogue() -> dict[str, list[dict[str, Any]]]:
    """Deep Learning VM families as published in late 2026 (real-cloud-audit B1): the cu128 /
    driver-570 Ubuntu 24.04 family is retired (every image deprecated, so getFromFamily answers
    404), cu129 / driver-580 is current. 50 GB is the images' disk size (`diskSizeGb`)."""
    p = DLVM_PROJECT
    return {p: [
        catalogue_image(p, "common-cu128-ubuntu-2404-nvidia-570-v20260210",
                        "common-cu128-ubuntu-2404-nvidia-570", "2026-02-10", deprecated=True),
        catalogue_image(p, "common-cu128-ubuntu-2404-nvidia-570-v20260323",
                        "common-cu128-ubuntu-2404-nvidia-570", "2026-03-23", deprecated=True),
        catalogue_image(p, "common-cu128-ubuntu-2204-nvidia-570-v20260323",
                        "common-cu128-ubuntu-2204-nvidia-570", "2026-03-23"),
        catalogue_image(p, "common-cu129-ubuntu-2404-nvidia-580-v20260819",
                        "common-cu129-ubuntu-2404-nvidia-580", "2026-08-19"),
        catalogue_image(p, "common-cu129-ubuntu-2404-nvidia-580-v20260909",
                        "common-cu129-ubuntu-2404-nvidia-580", "2026-09-09"),
        catalogue_image(p, "common-cu129-ubuntu-2204-nvidia-580-v20260909",
                        "common-cu129-ubuntu-2204-nvidia-580", "2026-09-09"),
        catalogue_image(p, "pytorch-2-9-cu129-ubuntu-2404-nvidia-580-v20260915",
                        "pytorch-2-9-cu129-ubuntu-2404-nvidia-580", "2026-09-15"),
    ]}


class FakeHttpError(Exception):
    def __init__(self, code: int, message: str, reason: str = "invalid",
                 status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code, self.message, self.reason, self.status = code, message, reason, status

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status,
                          "errors": [{"message": self.message, "domain": "global",
                                      "reason": self.reason}]}}


@dataclass
class FakeOperation:
    name: str
    zone: str
    operation_type: str
    target: str  # instance name
    project: str
    created: float
    done_at: float
    error: dict[str, Any] | None = None  # {"code", "message", "status", "errors": [...]}
    on_done: Callable[[], None] | None = None
    finished: bool = False

    def refresh(self, now: float) -> None:
        if not self.finished and now >= self.done_at:
            self.finished = True
            if self.on_done is not None:
                self.on_done()

    def to_json(self, now: float) -> dict[str, Any]:
        self.refresh(now)
        status = "DONE" if self.finished else ("RUNNING" if now > self.created else "PENDING")
        zone_url = f"{API}/projects/{self.project}/zones/{self.zone}"
        scope_url, target = zone_url, f"{zone_url}/instances/{self.target}"
        if self.zone == GLOBAL:  # images.insert: a global operation on an image
            scope_url = f"{API}/projects/{self.project}/global"
            target = f"{scope_url}/images/{self.target}"
        body: dict[str, Any] = {
            "kind": "compute#operation", "id": str(abs(hash(self.name)) % 10**12),
            "name": self.name, "operationType": self.operation_type,
            "targetLink": target, "status": status,
            "progress": 100 if status == "DONE" else 0,
            "selfLink": f"{scope_url}/operations/{self.name}",
        }
        if self.zone != GLOBAL:
            body["zone"] = zone_url
        if status == "DONE" and self.error is not None:
            body["httpErrorStatusCode"] = self.error["code"]
            body["httpErrorMessage"] = self.error["status"]
            body["error"] = {"errors": self.error["errors"]}
        return body


@dataclass
class FakeInstance:
    name: str
    zone: str
    project: str
    body: dict[str, Any]  # the inserted resource (REST JSON)
    ip: str
    created: float
    provision_s: float
    staging_s: float
    host_keys: list[tuple[str, str]]
    id: int = 0
    deleting_at: float | None = None  # STOPPING since; gone after stop_s
    stopped_at: float | None = None  # STOP action: STOPPING since; TERMINATED after stop_s
    preempted: bool = False
    preempted_etag: int = 1
    gone: bool = False
    guest_attr_delay_s: float = 0.0
    ended_by: str | None = None  # "maxRunDuration" | "lease" when GCE or the guest ended it
    lease_changed_at: float = 0.0  # when setMetadata last changed the lease stamp (the
    #: guest's watcher times the lease from there, on its own clock)
    guest_written: dict[str, dict[str, str]] = field(default_factory=dict)  # PUT by the guest
    watchers: threading.Condition = field(default_factory=threading.Condition)

    def status(self, now: float, stop_s: float) -> str:
        for since in (self.deleting_at, self.stopped_at):
            if since is not None:
                return "STOPPING" if now < since + stop_s else "TERMINATED"
        age = now - self.created
        if age < self.provision_s:
            return "PROVISIONING"
        if age < self.provision_s + self.staging_s:
            return "STAGING"
        return "RUNNING"

    def running_since(self) -> float:
        return self.created + self.provision_s + self.staging_s

    def to_json(self, now: float, stop_s: float) -> dict[str, Any]:
        zone_url = f"{API}/projects/{self.project}/zones/{self.zone}"
        body = json.loads(json.dumps(self.body))
        body.update({
            "kind": "compute#instance", "id": str(self.id), "name": self.name,
            "zone": zone_url, "status": self.status(now, stop_s),
            "selfLink": f"{zone_url}/instances/{self.name}",
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00",
                                               time.gmtime(self.created)),
        })
        body.setdefault("metadata", {})["fingerprint"] = self.metadata_fingerprint()
        nics = body.get("networkInterfaces") or [{}]
        nics[0]["networkIP"] = self.ip
        for access in nics[0].get("accessConfigs", []):
            access["natIP"] = self.ip
        body["networkInterfaces"] = nics
        return body

    def metadata(self) -> dict[str, str]:
        return {i["key"]: i.get("value", "") for i in self.body.get("metadata", {}).get("items", [])}

    def metadata_fingerprint(self) -> str:
        items = json.dumps(self.body.get("metadata", {}).get("items", []), sort_keys=True)
        return base64.b64encode(hashlib.sha256(items.encode()).digest()[:8]).decode()

    def accelerators(self) -> list[tuple[str, int]]:
        """(accelerator name, count), attached or built into the machine type."""
        out = [(a["acceleratorType"].rsplit("/", 1)[-1], int(a.get("acceleratorCount", 1)))
               for a in self.body.get("guestAccelerators", [])]
        machine = self.body.get("machineType", "").rsplit("/", 1)[-1]
        family = machine.split("-", 1)[0]
        if family in _BUILT_IN_GPUS:
            count = re.search(r"-(\d+)g$", machine)  # a2-highgpu-4g: 4 GPUs
            n = _GPU_COUNTS.get(machine, int(count.group(1)) if count else 1)
            out.append((_GPU_TYPES.get(machine.rsplit("-", 1)[0], _BUILT_IN_GPUS[family]), n))
        return out

    def spot(self) -> bool:
        return self.body.get("scheduling", {}).get("provisioningModel") == "SPOT"


# --- the filter language: the subset of AIP-160 the client docs show --------------------------

_TERM = re.compile(r'^\s*([A-Za-z][\w.\-]*)\s*(=|!=|:)\s*(.+?)\s*$')


def _lookup(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


_REGEX_TERM = re.compile(r'^([A-Za-z][\w.\-]*)\s+(eq|ne)\s+(?:"(.*)"|\'(.*)\'|(\S+))$')


def matches_filter(obj: dict[str, Any], expression: str) -> bool:
    """`a = b AND (c:* ) AND d != "e"`, or one regex term `family eq "common-.*"` (RE2, the
    whole field); OR, NOT and other regex forms are a 400 (we never send them)."""
    expression = expression.strip()
    if not expression:
        return True
    regex = _REGEX_TERM.match(expression)
    if regex is not None:
        path, op, *literal = regex.groups()
        pattern = next(x for x in literal if x is not None)
        actual = _lookup(obj, path)
        found = actual is not None and re.fullmatch(pattern, str(actual)) is not None
        return found if op == "eq" else not found
    if re.search(r"\b(OR|NOT)\b|\b(eq|ne)\b", expression):
        raise FakeHttpError(400, f"Invalid value for field 'filter': '{expression}'. "
                            "The fake supports AND of simple terms only.")
    for raw in re.split(r"\bAND\b", expression):
        term = raw.strip().strip("()").strip()
        match = _TERM.match(term)
        if match is None:
            raise FakeHttpError(400, f"Invalid value for field 'filter': '{expression}'.")
        path, op, value = match.groups()
        value = value.strip('"')
        actual = _lookup(obj, path)
        if op == ":":
            ok = actual is not None and (value == "*" or value in str(actual))
        elif op == "=":
            ok = actual is not None and str(actual) == value
        else:
            ok = actual is None or str(actual) != value
        if not ok:
            return False
    return True


class FakeGce:
    """The fake's state and its HTTP server. Use as a context manager, or start()/stop().

    Delays are in seconds of wall time: `provision_s` (PROVISIONING), `staging_s` (STAGING),
    `insert_op_s` (insert operation until DONE), `delete_op_s` / `stop_s` (STOPPING until gone).
    `ip_pool`: addresses handed to instances in order (e.g. namespace SSH hosts); default
    10.128.0.2, .3, ... `host_keys_for(ip)`: the (keytype, base64 blob) pairs the guest agent
    would publish for a VM at `ip`; default: a fresh ed25519 key per VM. `on_gone(ip)`: called
    when a VM starts stopping (deleted or preempted), so a VM backed by a real host takes its
    processes with it as a real VM does (e.g. kill them on the namespace host).
    `login_refused_s`: a booting guest refuses SSH logins until this long after RUNNING (the
    guest agent has not created the account, `pam_nologin`); `on_boot(ip, seconds)` is called
    when a VM is created, with how long from now its host must refuse logins, so a VM backed
    by a real host boots like one (e.g. withhold the host's authorized_keys until then).
    """

    def __init__(self, project: str = "test-project", zones: tuple[str, ...] = DEFAULT_ZONES,
                 provision_s: float = 0.2, staging_s: float = 0.1, insert_op_s: float = 0.1,
                 delete_op_s: float = 0.1, stop_s: float = 0.1, wait_cap_s: float = WAIT_CAP_S,
                 guest_attr_delay_s: float = 0.0, ip_pool: list[str] | None = None,
                 host_keys_for: Callable[[str], list[tuple[str, str]]] | None = None,
                 on_gone: Callable[[str], None] | None = None, login_refused_s: float = 0.0,
                 on_boot: Callable[[str, float], None] | None = None,
                 address: str = "127.0.0.1") -> None:
        self.project = project
        #: where the API listens: loopback, or a test bed's gateway where VMs reach it too (a
        #: detached sweep's controller VM calls the Compute API itself)
        self.address = address
        self.zones = list(zones)
        self.provision_s, self.staging_s = provision_s, staging_s
        self.insert_op_s, self.delete_op_s, self.stop_s = insert_op_s, delete_op_s, stop_s
        self.wait_cap_s = wait_cap_s
        self.guest_attr_delay_s = guest_attr_delay_s
        self.accelerators: dict[str, set[str]] = {z: set(DEFAULT_ACCELERATORS) for z in zones}
        self.stockouts: dict[str, int | None] = {}  # zone -> remaining failing inserts (None: all)
        self.quotas: dict[tuple[str, str | None], int] = {}  # (metric, region|None) -> limit
        self.project_metadata: dict[str, str] = {}  # commonInstanceMetadata (enable-oslogin)
        #: (image project, family) that resolve; None: every family resolves. Families of
        #: `image_catalogue` resolve as Google documents instead (its newest non-deprecated image)
        self.image_families: set[tuple[str, str]] | None = None
        #: image project -> its public images (name, family, creationTimestamp, diskSizeGb,
        #: deprecated.state), listed by images.list; seeded with DLVM families as published today
        self.image_catalogue: dict[str, list[dict[str, Any]]] = default_image_catalogue()
        #: network name -> its VPC firewall rules (REST JSON), served by
        #: networks.getEffectiveFirewalls; a network not here is a 404
        self.firewalls: dict[str, list[dict[str, Any]]] = default_firewalls()
        #: OS Login: user e-mail -> public keys imported (`users.importSshPublicKey`)
        self.oslogin_keys: dict[str, list[str]] = {}
        self.oslogin_denied = False  # importSshPublicKey answers 403 (no OS Login role)
        #: an organisation policy (compute.requireOsLogin) turns OS Login on whatever the
        #: metadata says: only a VM's effective metadata (instances.get) shows it
        self.oslogin_enforced = False
        #: OAuth: a user's refresh token -> their e-mail (`POST /token` issues access tokens,
        #: with the e-mail in their token info only for the e-mail scope); access token ->
        #: its token info (`/tokeninfo`, the endpoint google-auth names)
        self.oauth_users: dict[str, str] = {}
        self.token_info: dict[str, dict[str, str]] = {}
        #: IAM: service accounts of the project (e-mail -> {"disabled": bool}), seeded with the
        #: default compute account; the project's IAM policy (role -> members), where the
        #: default account is Editor as in projects made before May 2024; permissions of the
        #: roles IAM roles.get answers (predefined ones listed, custom ones added by tests)
        self.default_service_account = "1234-compute@developer.gserviceaccount.com"
        self.service_accounts: dict[str, dict[str, Any]] = {
            self.default_service_account: {"disabled": False}}
        self.iam_policy: dict[str, list[str]] = {
            "roles/editor": [f"serviceAccount:{self.default_service_account}"]}
        self.iam_policy_denied = False  # getIamPolicy answers 403 (the caller may not read it)
        self.roles: dict[str, list[str]] = {
            "roles/compute.instanceAdmin.v1": ["compute.instances.delete",
                                               "compute.instances.get"],
            "roles/compute.viewer": ["compute.instances.get", "compute.instances.list"],
            "roles/logging.logWriter": ["logging.logEntries.create"]}
        #: zone -> insert calls left that create the VM and then answer 503 anyway
        self.insert_errors: dict[str, int] = {}
        self.preempt_booting = 0  # the next N Spot VMs are preempted while PROVISIONING
        #: delete of a VM that GCE itself is stopping (preemption) answers RESOURCE_NOT_READY
        self.not_ready_while_stopping = False
        self.ip_hold_s = 0.0  # an internal IP stays in use this long after its VM is gone
        self.guest_lease_watch = True  # emulate the VMs' lease watchers (see `_enforce`)
        self.gpu_driver_ok = True  # False: GPU VMs' nvidia-smi finds no driver
        #: 403 or 412: getGuestAttributes is refused with that code, as in an organisation
        #: whose policy `compute.disableGuestAttributesAccess` is enforced (None: allowed)
        self.guest_attributes_denied: int | None = None
        #: guest attribute namespace -> which VMs GCE preempts when first asked for it
        #: (`preempt_when_read`)
        self.preempt_on_read: dict[str, list[Callable[[FakeInstance], bool]]] = {}
        self.api_down = False  # True: the API answers 503 to everything (the VMs' own
        #: metadata servers, and so their watchers, keep working): the orchestrator's link is cut
        self.instances: dict[tuple[str, str], FakeInstance] = {}  # (zone, name)
        self.operations: dict[tuple[str, str], FakeOperation] = {}
        self.images: dict[str, dict[str, Any]] = {}  # custom images by name (images.insert)
        self.request_ids: dict[str, FakeOperation] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self._ip_pool = list(ip_pool) if ip_pool else None
        self._host_keys_for = host_keys_for or _random_host_keys
        self._on_gone = on_gone
        self.login_refused_s = login_refused_s
        self._on_boot = on_boot
        self._ids = itertools.count(1000)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeGce:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer((self.address, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-gce",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGce:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://{self.address}:{self._server.server_address[1]}"

    def metadata_url(self, zone: str, name: str) -> str:
        """Base URL of the fake metadata server of one instance (…/computeMetadata/v1)."""
        return f"{self.endpoint}/_metadata/{zone}/{name}/computeMetadata/v1"

    # --- scripting hooks -------------------------------------------------------------------

    def stockout(self, zone: str, inserts: int | None = None) -> None:
        """The next `inserts` inserts in `zone` (None: all, until cleared) fail with a stock-out."""
        with self._lock:
            self.stockouts[zone] = inserts

    def clear_stockout(self, zone: str) -> None:
        with self._lock:
            self.stockouts.pop(zone, None)

    def set_quota(self, metric: str, limit: int, region: str | None = None) -> None:
        """E.g. ("PREEMPTIBLE_NVIDIA_T4_GPUS", 2, "us-central1") or ("GPUS_ALL_REGIONS", 4)."""
        with self._lock:
            self.quotas[(metric, region)] = limit

    def live_instances(self) -> list[FakeInstance]:
        """Instances that exist (any status but gone), i.e. what would be billed."""
        with self._lock:
            return [i for i in self.instances.values() if not self._is_gone(i)]

    def preempt(self, zone: str, name: str) -> None:
        """Preempt a Spot VM as GCE does: `preempted` flips to TRUE, the termination action runs,
        a `compute.instances.preempted` operation is recorded."""
        with self._lock:
            inst = self._instance(zone, name)
            now = time.time()
            action = inst.body.get("scheduling", {}).get("instanceTerminationAction", "STOP")
            inst.preempted = True
            inst.preempted_etag += 1
            if action == "DELETE":
                inst.deleting_at = now
            else:
                inst.stopped_at = now
            op = self._new_operation(zone, name, "compute.instances.preempted", now)
            op.done_at = now
        with inst.watchers:
            inst.watchers.notify_all()
        if self._on_gone is not None:
            self._on_gone(inst.ip)

    def preempt_when_read(self, namespace: str, match: Callable[[FakeInstance], bool]) -> None:
        """Preempt the next RUNNING VM that `match` accepts when its guest attributes under
        `namespace` are asked for (`hostkeys`: the host-key wait; `transient-gpu`: the GPU
        check), that ask answering as a gone VM's does: GCE takes a Spot VM back at any moment
        after RUNNING, before anything used it too. One VM per call."""
        with self._lock:
            self.preempt_on_read.setdefault(namespace, []).append(match)

    def _preempt_if_asked(self, zone: str, name: str, namespace: str) -> None:
        with self._lock:
            inst = self.instances.get((zone, name))
            triggers = self.preempt_on_read.get(namespace, [])
            if inst is None or inst.status(time.time(), self.stop_s) != "RUNNING":
                return
            match = next((m for m in triggers if m(inst)), None)
            if match is None:
                return
            triggers.remove(match)
        self.preempt(zone, name)

    def stop_instance(self, zone: str, name: str) -> FakeOperation:
        """instances.stop: STOPPING, TERMINATED after `stop_s`; the disk is kept (its host is
        powered off through `on_gone`, like a preemption with the STOP action)."""
        with self._lock:
            inst = self._instance(zone, name)
            now = time.time()
            if inst.deleting_at is None and inst.stopped_at is None:
                inst.stopped_at = now
            op = self._new_operation(zone, name, "stop", now, self.stop_s)
        if self._on_gone is not None:
            self._on_gone(inst.ip)
        return op

    def insert_image(self, body: dict[str, Any]) -> FakeOperation:
        """images.insert from a stopped VM's boot disk (`sourceDisk`: .../zones/Z/disks/NAME,
        named like its instance): `image_from_instance` makes the image (a subclass with real
        disks copies one); an image of that name already there is the cloud's 409."""
        name = body.get("name", "")
        match = re.search(r"zones/([^/]+)/disks/([^/]+)$", body.get("sourceDisk", ""))
        if not name or match is None:
            raise FakeHttpError(400, "images.insert needs a name and a sourceDisk "
                                "(zones/ZONE/disks/DISK)")
        with self._lock:
            if name in self.images:
                raise FakeHttpError(409, f"The resource 'projects/{self.project}/global/images/"
                                    f"{name}' already exists", "alreadyExists", "ALREADY_EXISTS")
        self.image_from_instance(match[1], match[2], name)
        with self._lock:
            self.images[name] = {**body, "status": "READY"}
            now = time.time()
            return self._new_operation(GLOBAL, name, "insert", now, self.insert_op_s)

    def image_from_instance(self, zone: str, instance: str, image: str) -> str:
        """The image from a stopped (TERMINATED) VM's disk; its URL. Here only the check that
        the disk is not in use (IsolatedFakeGce copies the disk)."""
        with self._lock:
            inst = self._instance(zone, instance)
            if inst.status(time.time(), self.stop_s) != "TERMINATED":
                raise FakeHttpError(400, f"The disk of instance '{instance}' is in use: stop "
                                    "the instance first", "resourceInUseByAnotherResource")
        return f"projects/{self.project}/global/images/{image}"

    def api_calls(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def effective_os_login(self, inst: FakeInstance) -> bool:
        """OS Login as GCE resolves it for `inst`: an enforcing organisation policy, else the
        instance's `enable-oslogin`, else the project's (instance values win)."""
        if self.oslogin_enforced:
            return True
        value = inst.metadata().get("enable-oslogin", self.project_metadata.get("enable-oslogin"))
        return (value or "").strip().lower() in ("true", "1", "yes", "y")

    # --- internals -------------------------------------------------------------------------

    def _enforce(self, inst: FakeInstance, now: float) -> None:
        """What GCE and the guest do on their own: `maxRunDuration` runs the termination
        action; the guest's lease watcher (`body.lease_watcher_script`, emulated here unless
        `guest_lease_watch` is off) deletes its VM once `transient-lease-s` has passed since the
        lease stamp last changed (or since boot, when its watcher started): the stamp's value
        itself, the orchestrator's clock, means nothing to the guest."""
        if inst.deleting_at is not None or inst.stopped_at is not None:
            return
        scheduling = inst.body.get("scheduling", {})
        limit = scheduling.get("maxRunDuration", {}).get("seconds")
        if limit is not None and now >= inst.running_since() + float(limit):
            end = inst.running_since() + float(limit)
            if scheduling.get("instanceTerminationAction", "STOP") == "DELETE":
                inst.deleting_at = end
            else:
                inst.stopped_at = end
            inst.ended_by = "maxRunDuration"
            return
        metadata = inst.metadata()
        if self.guest_lease_watch and metadata.get(LEASE_KEY) and metadata.get(LEASE_S_KEY):
            end = max(inst.running_since(), inst.lease_changed_at) + float(metadata[LEASE_S_KEY])
            if now > end:
                inst.deleting_at = end
                inst.ended_by = "lease"

    def _is_gone(self, inst: FakeInstance) -> bool:
        if inst.gone:
            return True
        self._enforce(inst, time.time())
        if inst.deleting_at is not None and time.time() >= inst.deleting_at + self.stop_s:
            inst.gone = True
        return inst.gone

    def _instance(self, zone: str, name: str) -> FakeInstance:
        self._check_zone(zone)
        inst = self.instances.get((zone, name))
        if inst is None or self._is_gone(inst):
            raise FakeHttpError(404, f"The resource 'projects/{self.project}/zones/{zone}/"
                                f"instances/{name}' was not found", "notFound", "NOT_FOUND")
        return inst

    def _check_zone(self, zone: str) -> None:
        if zone not in self.zones:
            raise FakeHttpError(400, f"Invalid value for field 'zone': '{zone}'. Unknown zone.")

    def _new_operation(self, zone: str, target: str, kind: str, now: float,
                       delay: float = 0.0) -> FakeOperation:
        op = FakeOperation(name=f"operation-{next(self._ids)}-{kind.rsplit('.', 1)[-1]}",
                           zone=zone, operation_type=kind, target=target, project=self.project,
                           created=now, done_at=now + delay)
        self.operations[(zone, op.name)] = op
        return op

    def _next_ip(self, requested: str | None) -> str:
        now = time.time()
        used = {i.ip for i in self.instances.values() if not self._is_gone(i)
                or (i.deleting_at is not None
                    and now < i.deleting_at + self.stop_s + self.ip_hold_s)}
        if requested:
            if requested in used:
                raise FakeHttpError(400, f"IP '{requested}' is already being used by another "
                                    "resource.", "ipInUseByAnotherResource")
            return requested
        if self._ip_pool is not None:
            for ip in self._ip_pool:
                if ip not in used:
                    return ip
            raise FakeHttpError(503, "fake: no free address in ip_pool", "backendError",
                                "UNAVAILABLE")
        for n in itertools.count(2):
            ip = f"10.128.{n // 250}.{n % 250 + 2}"
            if ip not in used:
                return ip
        raise AssertionError("unreachable")

    def usage(self, metric: str, region: str | None) -> int:
        """What the live instances use of `metric` in `region` (None: all regions)."""
        with self._lock:
            return sum(self._demand(inst.body, region_of(inst.zone)).get(metric, 0)
                       for inst in self.live_instances()
                       if region is None or region_of(inst.zone) == region)

    def _demand(self, body: dict[str, Any], region: str) -> dict[str, int]:
        """Quota metrics one instance counts against, as GCE counts them: a Spot VM against
        PREEMPTIBLE_* where the region has that quota, else against the standard one."""
        probe = FakeInstance("probe", "", self.project, body, "", 0, 0, 0, [])
        spot = probe.spot()

        def regional(metric: str) -> str:
            preemptible = f"PREEMPTIBLE_{metric}"
            return preemptible if spot and self.quotas.get((preemptible, region), 0) > 0 \
                else metric

        demand: collections.Counter[str] = collections.Counter()
        cpus = machine_cpus(body.get("machineType", "").rsplit("/", 1)[-1])
        if cpus:
            demand["CPUS_ALL_REGIONS"] += cpus
            demand[regional("CPUS")] += cpus
        for gpu, n in probe.accelerators():
            demand["GPUS_ALL_REGIONS"] += n
            short = _GPU_QUOTA_NAMES.get(gpu)
            if short is not None:
                demand[regional(f"NVIDIA_{short}_GPUS")] += n
        nics = body.get("networkInterfaces") or [{}]
        if nics[0].get("accessConfigs"):
            demand["IN_USE_ADDRESSES"] += 1
        for disk in body.get("disks", []):  # persistent disks: SSD_TOTAL_GB or DISKS_TOTAL_GB
            params = disk.get("initializeParams", {})
            kind = str(params.get("diskType", "pd-standard")).rsplit("/", 1)[-1]
            size = int(params.get("diskSizeGb") or 10)
            demand["DISKS_TOTAL_GB" if kind == "pd-standard" else "SSD_TOTAL_GB"] += size
        return dict(demand)

    def _quota_error(self, zone: str, inst_body: dict[str, Any]) -> dict[str, Any] | None:
        wanted = self._demand(inst_body, region_of(zone))
        for (metric, q_region), limit in sorted(self.quotas.items(), key=str):
            if q_region is not None and q_region != region_of(zone):
                continue
            add = wanted.get(metric, 0)
            if add and self.usage(metric, q_region) + add > limit:
                where = f"in region {q_region}" if q_region else "globally"
                message = f"Quota '{metric}' exceeded.  Limit: {float(limit)} {where}."
                info = {"metricName": f"compute.googleapis.com/{metric.lower()}",
                        "limitName": f"{metric}-per-project" + ("-region" if q_region else ""),
                        "dimensions": {"region": q_region} if q_region else {},
                        "limit": float(limit)}
                return {"code": 403, "status": "FORBIDDEN", "errors": [
                    {"code": "QUOTA_EXCEEDED", "message": message,
                     "errorDetails": [{"quotaInfo": info}]}]}
        return None

    def quota_list(self, region: str | None) -> list[dict[str, Any]]:
        """`quotas` of projects.get (region None) or regions.get: the limits set, with usage."""
        with self._lock:
            return [{"metric": metric, "limit": float(limit),
                     "usage": float(self.usage(metric, region))}
                    for (metric, q_region), limit in sorted(self.quotas.items(), key=str)
                    if q_region == region]

    def insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> FakeOperation:
        with self._lock:
            self._check_zone(zone)
            if request_id and request_id in self.request_ids:
                return self.request_ids[request_id]
            name = body.get("name", "")
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
                raise FakeHttpError(400, f"Invalid value for field 'resource.name': '{name}'. "
                                    "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}"
                                    "[a-z0-9])?|[1-9][0-9]{0,19})'")
            labels = body.get("labels", {})
            if len(labels) > 64:  # GCE's limit per resource (gce-notes, `labels`)
                raise FakeHttpError(400, "Invalid value for field 'resource.labels': "
                                    f"{len(labels)} labels; a resource takes at most 64")
            for key, value in labels.items():
                if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key) or \
                        not re.fullmatch(r"[a-z0-9_-]{0,63}", value):
                    raise FakeHttpError(400, f"Invalid value for field 'resource.labels': "
                                        f"'{key}={value}'")
            for acc in body.get("guestAccelerators", []):
                gpu = acc["acceleratorType"].rsplit("/", 1)[-1]
                if gpu not in self.accelerators[zone]:
                    raise FakeHttpError(400, f"Invalid value for field 'resource.guestAccelerators"
                                        f"[0].acceleratorType': '{acc['acceleratorType']}'. The "
                                        f"resource 'projects/{self.project}/zones/{zone}/"
                                        f"acceleratorTypes/{gpu}' was not found", "invalid")
            existing = self.instances.get((zone, name))
            if existing is not None and not self._is_gone(existing):
                raise FakeHttpError(409, f"The resource 'projects/{self.project}/zones/{zone}/"
                                    f"instances/{name}' already exists", "alreadyExists",
                                    "ALREADY_EXISTS")
            now = time.time()
            op = self._new_operation(zone, name, "insert", now, self.insert_op_s)
            if request_id:
                self.request_ids[request_id] = op
            if zone in self.stockouts:
                left = self.stockouts[zone]
                if left is not None:
                    if left <= 1:
                        del self.stockouts[zone]
                    else:
                        self.stockouts[zone] = left - 1
                message = (f"The zone 'projects/{self.project}/zones/{zone}' does not have enough "
                           "resources available to fulfill the request.  Try a different zone, "
                           "or try again later.")
                op.error = {"code": 503, "status": "SERVICE UNAVAILABLE", "errors": [
                    {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": message}]}
                return op
            quota = self._quota_error(zone, body)
            if quota is not None:
                op.error = quota
                return op
            nics = body.get("networkInterfaces") or [{}]
            ip = self._next_ip(nics[0].get("networkIP"))
            inst = FakeInstance(
                name=name, zone=zone, project=self.project, body=body, ip=ip, created=now,
                provision_s=self.provision_s, staging_s=self.staging_s,
                host_keys=self._host_keys_for(ip), id=next(self._ids),
                guest_attr_delay_s=self.guest_attr_delay_s)
            self.instances[(zone, name)] = inst
            preempt = self.preempt_booting > 0 and inst.spot()
            if preempt:
                self.preempt_booting -= 1
        if preempt:  # GCE takes the capacity back before the guest has booted
            timer = threading.Timer(self.provision_s / 2, self._preempt_if_alive, (zone, name))
            timer.daemon = True
            timer.start()
        if self._on_boot is not None:
            self._on_boot(ip, inst.running_since() + self.login_refused_s - time.time())
        return op

    def _preempt_if_alive(self, zone: str, name: str) -> None:
        with contextlib.suppress(FakeHttpError):
            self.preempt(zone, name)

    def fail_inserts(self, zone: str, calls: int) -> None:
        """The next `calls` insert requests in `zone` do their work (create the VM, or find the
        first operation of a repeated request id) and then answer 503, as a backend error or a
        lost response does: the VM may exist although the client saw an error."""
        with self._lock:
            self.insert_errors[zone] = calls

    def _after_insert(self, zone: str) -> None:
        with self._lock:
            left = self.insert_errors.get(zone, 0)
            if left <= 0:
                return
            self.insert_errors[zone] = left - 1
        raise FakeHttpError(503, "Internal error. Please try again or contact Google Support.",
                            "backendError", "UNAVAILABLE")

    def delete(self, zone: str, name: str, request_id: str | None) -> FakeOperation:
        with self._lock:
            if request_id and request_id in self.request_ids:
                return self.request_ids[request_id]
            inst = self._instance(zone, name)
            now = time.time()
            if self.not_ready_while_stopping and inst.preempted \
                    and inst.status(now, self.stop_s) == "STOPPING":
                raise FakeHttpError(400, f"The resource 'projects/{self.project}/zones/{zone}/"
                                    f"instances/{name}' is not ready", "resourceNotReady",
                                    "FAILED_PRECONDITION")
            stopping = inst.deleting_at is None and inst.stopped_at is None
            if inst.deleting_at is None:
                inst.deleting_at = now
                inst.stopped_at = None
            # The operation is DONE when the VM is gone (STOPPING lasts stop_s).
            op = self._new_operation(zone, name, "delete", now,
                                     max(self.delete_op_s, self.stop_s))
            if request_id:
                self.request_ids[request_id] = op
        if stopping and self._on_gone is not None:
            self._on_gone(inst.ip)
        return op

    def list_instances(self, zone: str, expression: str) -> list[dict[str, Any]]:
        with self._lock:
            self._check_zone(zone)
            now = time.time()
            bodies = [i.to_json(now, self.stop_s) for i in self.instances.values()
                      if i.zone == zone and not self._is_gone(i)]
        return [b for b in bodies if matches_filter(b, expression)]

    def guest_attributes(self, zone: str, name: str, query_path: str) -> dict[str, Any]:
        self._preempt_if_asked(zone, name, query_path.rstrip("/"))
        with self._lock:
            inst = self._instance(zone, name)
            if self.guest_attributes_denied is not None:
                code = self.guest_attributes_denied
                raise FakeHttpError(
                    code, f"Constraint constraints/compute.disableGuestAttributesAccess "
                    f"violated for project {self.project}: guest attributes are disabled.",
                    *(("forbidden", "PERMISSION_DENIED") if code == 403 else
                      ("conditionNotMet", "FAILED_PRECONDITION")))
            if inst.metadata().get("enable-guest-attributes", "").upper() != "TRUE":
                raise FakeHttpError(400, "Guest attributes are disabled for this instance "
                                    "(metadata enable-guest-attributes is not TRUE)")
            ready = time.time() >= inst.running_since() + inst.guest_attr_delay_s
            namespace = query_path.rstrip("/")
            gpus = sum(n for _, n in inst.accelerators())
            published = {"hostkeys": [(k, v) for k, v in inst.host_keys],
                         # what the startup script's GPU check publishes (body.gpu_check_script)
                         GPU_NAMESPACE: [("gpus", str(gpus) if self.gpu_driver_ok else
                                          "0: " + NO_DRIVER)] if gpus else []}
            for ns, values in inst.guest_written.items():  # what a real guest script wrote
                published[ns] = sorted(values.items())
            if inst.status(time.time(), self.stop_s) != "RUNNING" or not ready \
                    or not inst.host_keys or not published.get(namespace):
                raise FakeHttpError(404, f"The resource '{query_path}' of type 'Guest Attribute' "
                                    "was not found.", "notFound", "NOT_FOUND")
            items = [{"namespace": namespace, "key": k, "value": v}
                     for k, v in published[namespace]]
        return {"kind": "compute#guestAttributes", "queryPath": query_path,
                "queryValue": {"items": items}}


def machine_cpus(machine_type: str) -> int:
    """vCPUs of a machine type: the trailing count of `n1-standard-4`, `g2-standard-8`."""
    found = re.fullmatch(r"[a-z0-9]+-(?:standard|highmem|highcpu)-(\d+)", machine_type)
    return int(found.group(1)) if found else 0


def _random_host_keys(ip: str) -> list[tuple[str, str]]:
    """A fresh ed25519 public key in OpenSSH's blob form, as the guest agent publishes it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    kind, blob = public.decode().split()[:2]
    base64.b64decode(blob)  # well-formed
    return [(kind, blob)]


# --- HTTP ----------------------------------------------------------------------------------

_ZONE = r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
_GLOBAL = r"/compute/v1/projects/(?P<project>[^/]+)/global"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"/compute/v1/projects/(?P<project>[^/]+)$"), "projects.get"),
    ("POST", re.compile(r"/v1/users/(?P<user>[^/:]+):importSshPublicKey$"),
     "oslogin.importSshPublicKey"),
    ("POST", re.compile(r"/tokeninfo$"), "oauth.tokeninfo"),
    ("POST", re.compile(r"/token$"), "oauth.token"),
    ("POST", re.compile(r"/v1/projects/(?P<project>[^/:]+):getIamPolicy$"),
     "crm.getIamPolicy"),
    ("GET", re.compile(r"/v1/projects/(?P<sa_project>[^/]+)/serviceAccounts/(?P<email>[^/]+)$"),
     "iam.serviceAccounts.get"),
    ("GET", re.compile(r"/v1/(?P<role>(?:projects/[^/]+/)?roles/[^/]+)$"), "iam.roles.get"),
    ("GET", re.compile(r"/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)$"),
     "regions.get"),
    ("GET", re.compile(r"/compute/v1/projects/(?P<image_project>[^/]+)/global/images/family/"
                       r"(?P<family>[^/]+)$"), "images.getFromFamily"),
    ("GET", re.compile(r"/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances$"),
     "instances.aggregatedList"),
    ("POST", re.compile(_ZONE + r"/instances$"), "instances.insert"),
    ("GET", re.compile(_ZONE + r"/instances$"), "instances.list"),
    ("GET", re.compile(_ZONE + r"/instances/(?P<name>[^/]+)/getGuestAttributes$"),
     "instances.getGuestAttributes"),
    ("POST", re.compile(_ZONE + r"/instances/(?P<name>[^/]+)/preempt$"), "test.preempt"),
    ("POST", re.compile(_ZONE + r"/instances/(?P<name>[^/]+)/setMetadata$"),
     "instances.setMetadata"),
    ("GET", re.compile(_ZONE + r"/instances/(?P<name>[^/]+)$"), "instances.get"),
    ("DELETE", re.compile(_ZONE + r"/instances/(?P<name>[^/]+)$"), "instances.delete"),
    ("GET", re.compile(_ZONE + r"/operations$"), "zoneOperations.list"),
    ("GET", re.compile(_ZONE + r"/operations/(?P<op>[^/]+)$"), "zoneOperations.get"),
    ("POST", re.compile(_ZONE + r"/operations/(?P<op>[^/]+)/wait$"), "zoneOperations.wait"),
    ("GET", re.compile(r"/_metadata/(?P<zone>[^/]+)/(?P<name>[^/]+)/computeMetadata/v1/"
                       r"instance/preempted$"), "metadata.preempted"),
    ("GET", re.compile(r"/_metadata/(?P<zone>[^/]+)/(?P<name>[^/]+)/computeMetadata/v1/"
                       r"(?P<path>.+)$"), "metadata.value"),
    ("PUT", re.compile(r"/_metadata/(?P<zone>[^/]+)/(?P<name>[^/]+)/computeMetadata/v1/"
                       r"instance/guest-attributes/(?P<ns>[^/]+)/(?P<key>[^/]+)$"),
     "metadata.putGuestAttribute"),
    ("POST", re.compile(_ZONE + r"/instances/(?P<name>[^/]+)/stop$"), "instances.stop"),
    ("GET", re.compile(_GLOBAL + r"/networks/(?P<network>[^/]+)/getEffectiveFirewalls$"),
     "networks.getEffectiveFirewalls"),
    ("POST", re.compile(_GLOBAL + r"/images$"), "images.insert"),
    ("GET", re.compile(r"/compute/v1/projects/(?P<image_project>[^/]+)/global/images$"),
     "images.list"),
    ("GET", re.compile(_GLOBAL + r"/images/(?P<name>[^/]+)$"), "images.get"),
    ("GET", re.compile(_GLOBAL + r"/operations/(?P<op>[^/]+)$"), "globalOperations.get"),
    ("POST", re.compile(_GLOBAL + r"/operations/(?P<op>[^/]+)/wait$"), "globalOperations.wait"),
]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGce
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        for verb, pattern, endpoint in _ROUTES:
            match = pattern.match(url.path)
            if verb != method or match is None:
                continue
            args = match.groupdict()
            if not endpoint.startswith(("test.", "metadata.")):
                with self.fake._lock:
                    self.fake.calls[endpoint] += 1
            try:
                if self.fake.api_down and not endpoint.startswith(("test.", "metadata.")):
                    raise FakeHttpError(503, "fake: the orchestrator's link is cut",
                                        "backendError", "UNAVAILABLE")
                if args.get("project", self.fake.project) != self.fake.project:
                    raise FakeHttpError(404, f"The resource 'projects/{args['project']}' was not "
                                        "found", "notFound", "NOT_FOUND")
                status, body = getattr(self, "_" + endpoint.replace(".", "_"))(
                    args, query, raw.decode(errors="replace")
                    if endpoint.startswith(("metadata.", "oauth.")) else json.loads(raw) if raw
                    else {})
            except FakeHttpError as err:
                status, body = err.code, err.body()
            except _AlreadySent:
                return
            self._send(status, body)
            return
        self._send(404, FakeHttpError(404, f"fake: no route for {method} {url.path}",
                                      "notFound", "NOT_FOUND").body())

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str)
                         else "application/text")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    # --- endpoints ---------------------------------------------------------------------------

    def _oslogin_importSshPublicKey(self, a: dict[str, str], q: dict[str, str],
                                    body: dict[str, Any]) -> tuple[int, Any]:
        """OS Login: add the key to the user's login profile; the profile names the POSIX
        account to log in as (`alice@example.com` -> `alice_example_com`, as Google does)."""
        fake = self.fake
        user = urllib.parse.unquote(a["user"])
        if q.get("projectId") not in (None, fake.project):
            raise FakeHttpError(404, f"project {q.get('projectId')} not found", "notFound",
                                "NOT_FOUND")
        if fake.oslogin_denied:
            raise FakeHttpError(403, f"Permission denied on resource users/{user} (or it may "
                                "not exist).", "forbidden", "PERMISSION_DENIED")
        key = str(body.get("key", "")).strip()
        if not key.startswith(("ssh-", "ecdsa-")):
            raise FakeHttpError(400, "Invalid SSH public key", "invalid", "INVALID_ARGUMENT")
        with fake._lock:
            keys = fake.oslogin_keys.setdefault(user, [])
            if key not in keys:
                keys.append(key)
        fingerprint = base64.b16encode(key.split()[1][:24].encode()).decode().lower()
        return 200, {"loginProfile": {
            "name": user,
            "posixAccounts": [{"primary": True, "username": re.sub(r"[^a-z0-9_]", "_",
                                                                   user.lower()),
                               "uid": "1001", "gid": "1001",
                               "homeDirectory": "/home/" + re.sub(r"[^a-z0-9_]", "_",
                                                                  user.lower()),
                               "operatingSystemType": "LINUX", "accountId": fake.project}],
            "sshPublicKeys": {fingerprint: {"key": key, "fingerprint": fingerprint}}}}

    def _projects_get(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        fake = self.fake
        items = [{"key": k, "value": v} for k, v in fake.project_metadata.items()]
        return 200, {"kind": "compute#project", "name": fake.project, "id": "1234",
                     "defaultServiceAccount": fake.default_service_account,
                     "quotas": fake.quota_list(None),
                     "commonInstanceMetadata": {"kind": "compute#metadata",
                                                "fingerprint": "ZmFrZQ==", "items": items}}

    def _regions_get(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        region = a["region"]
        if region not in {region_of(z) for z in self.fake.zones}:
            raise FakeHttpError(404, f"The resource 'projects/{self.fake.project}/regions/"
                                f"{region}' was not found", "notFound", "NOT_FOUND")
        return 200, {"kind": "compute#region", "name": region, "status": "UP",
                     "zones": [f"{API}/projects/{self.fake.project}/zones/{z}"
                               for z in self.fake.zones if region_of(z) == region],
                     "quotas": self.fake.quota_list(region)}

    def _images_getFromFamily(self, a: dict[str, str], q: dict[str, str],
                              _: Any) -> tuple[int, Any]:
        """The newest non-deprecated image of the family (404 once every image of it is
        deprecated, as Google documents) for families of the catalogue; else `image_families`."""
        families = self.fake.image_families
        key = (a["image_project"], a["family"])
        with self.fake._lock:
            listed = [i for i in self.fake.image_catalogue.get(key[0], [])
                      if i.get("family") == key[1]]
        if listed:
            live = [i for i in listed
                    if i.get("deprecated", {}).get("state") not in _DEPRECATED_STATES]
            if not live:
                raise FakeHttpError(404, f"The resource 'projects/{key[0]}/global/images/"
                                    f"family/{key[1]}' was not found", "notFound", "NOT_FOUND")
            return 200, max(live, key=lambda i: i["creationTimestamp"])
        if families is not None and key not in families:
            raise FakeHttpError(404, f"The resource 'projects/{key[0]}/global/images/family/"
                                f"{key[1]}' was not found", "notFound", "NOT_FOUND")
        return 200, {"kind": "compute#image", "name": f"{key[1]}-v20260101", "family": key[1],
                     "status": "READY",
                     "selfLink": f"{API}/projects/{key[0]}/global/images/{key[1]}-v20260101"}

    def _instances_insert(self, a: dict[str, str], q: dict[str, str],
                          body: dict[str, Any]) -> tuple[int, Any]:
        op = self.fake.insert(a["zone"], body, q.get("requestId"))
        self.fake._after_insert(a["zone"])
        return 200, op.to_json(time.time())

    def _instances_get(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        with self.fake._lock:
            inst = self.fake._instance(a["zone"], a["name"])
            body = inst.to_json(time.time(), self.fake.stop_s)
            body["resourceStatus"] = {"effectiveInstanceMetadata": {
                "enableOsloginMetadataValue": self.fake.effective_os_login(inst)}}
            return 200, body

    def _oauth_tokeninfo(self, a: dict[str, str], q: dict[str, str],
                         form: str) -> tuple[int, Any]:
        """What an access token is (`access_token` in the form or the query); 400 for a token
        Google does not know, as the real endpoint answers."""
        token = (urllib.parse.parse_qs(form).get("access_token") or [q.get("access_token")])[-1]
        with self.fake._lock:
            info = self.fake.token_info.get(token or "")
        if info is None:
            return 400, {"error": "invalid_token", "error_description": "Invalid Value"}
        return 200, info

    def _oauth_token(self, a: dict[str, str], q: dict[str, str], form: str) -> tuple[int, Any]:
        """The refresh-token grant: a new access token for `scope` (the e-mail in its token
        info only when the scope includes the e-mail scope)."""
        fields = {k: v[-1] for k, v in urllib.parse.parse_qs(form).items()}
        fake = self.fake
        with fake._lock:
            email = fake.oauth_users.get(fields.get("refresh_token", ""))
            if fields.get("grant_type") != "refresh_token" or email is None:
                return 400, {"error": "invalid_grant", "error_description": "Bad Request"}
            scope = fields.get("scope", "https://www.googleapis.com/auth/cloud-platform")
            token = f"ya29.fake-{len(fake.token_info)}"
            info = {"aud": fields.get("client_id", ""), "scope": scope, "expires_in": "3599"}
            if "userinfo.email" in scope or "email" in scope.split():
                info.update(email=email, email_verified="true")
            fake.token_info[token] = info
        return 200, {"access_token": token, "expires_in": 3599, "scope": scope,
                     "token_type": "Bearer"}

    def _crm_getIamPolicy(self, a: dict[str, str], q: dict[str, str],
                          _: Any) -> tuple[int, Any]:
        """The project's own IAM policy (Resource Manager v1)."""
        fake = self.fake
        if fake.iam_policy_denied:
            raise FakeHttpError(403, "The caller does not have permission", "forbidden",
                                "PERMISSION_DENIED")
        with fake._lock:
            bindings = [{"role": r, "members": list(m)} for r, m in fake.iam_policy.items() if m]
        return 200, {"version": 1, "etag": "BwX=", "bindings": bindings}

    def _iam_serviceAccounts_get(self, a: dict[str, str], q: dict[str, str],
                                 _: Any) -> tuple[int, Any]:
        fake = self.fake
        email = urllib.parse.unquote(a["email"])
        with fake._lock:
            account = fake.service_accounts.get(email)
        if account is None:
            raise FakeHttpError(404, "Unknown service account", "notFound", "NOT_FOUND")
        return 200, {"name": f"projects/{fake.project}/serviceAccounts/{email}",
                     "projectId": fake.project, "email": email,
                     "disabled": bool(account.get("disabled"))}

    def _iam_roles_get(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        with self.fake._lock:
            permissions = self.fake.roles.get(a["role"])
        if permissions is None:
            raise FakeHttpError(404, f"The role named {a['role']} was not found.", "notFound",
                                "NOT_FOUND")
        return 200, {"name": a["role"], "includedPermissions": list(permissions)}

    def _instances_setMetadata(self, a: dict[str, str], q: dict[str, str],
                               body: dict[str, Any]) -> tuple[int, Any]:
        fake = self.fake
        with fake._lock:
            inst = fake._instance(a["zone"], a["name"])
            if body.get("fingerprint") != inst.metadata_fingerprint():
                raise FakeHttpError(412, "Supplied fingerprint does not match current metadata "
                                    "fingerprint.", "conditionNotMet", "FAILED_PRECONDITION")
            stamp = inst.metadata().get(LEASE_KEY)
            inst.body["metadata"] = {"items": list(body.get("items", []))}
            if inst.metadata().get(LEASE_KEY) != stamp:
                inst.lease_changed_at = time.time()
            op = fake._new_operation(a["zone"], a["name"], "setMetadata", time.time())
            return 200, op.to_json(time.time())

    def _metadata_putGuestAttribute(self, a: dict[str, str], q: dict[str, str],
                                    body: Any) -> tuple[int, Any]:
        """The guest writes a guest attribute (its raw body is the value)."""
        fake = self.fake
        with fake._lock:
            inst = fake._instance(a["zone"], a["name"])
            inst.guest_written.setdefault(a["ns"], {})[a["key"]] = str(body)
        return 200, ""

    def _metadata_value(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        """The guest's metadata server: instance name/zone/attributes, the project id and a
        service-account token (what the lease watcher reads)."""
        fake = self.fake
        with fake._lock:
            inst = fake.instances.get((a["zone"], a["name"]))
            if inst is None or fake._is_gone(inst):
                raise FakeHttpError(404, "no such instance")
            path = a["path"]
            values = {"instance/name": inst.name,
                      "instance/zone": f"projects/1234/zones/{inst.zone}",
                      "project/project-id": fake.project,
                      "instance/service-accounts/default/token": json.dumps(
                          {"access_token": "fake-token", "expires_in": 3599,
                           "token_type": "Bearer"})}
            if path.startswith("instance/attributes/"):
                value = inst.metadata().get(path.split("/", 2)[2])
            else:
                value = values.get(path)
        if value is None:
            raise FakeHttpError(404, f"metadata {path} not found")
        data = value.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/text")
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        raise _AlreadySent

    def _instances_delete(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        op = self.fake.delete(a["zone"], a["name"], q.get("requestId"))
        return 200, op.to_json(time.time())

    def _instances_list(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        items = self.fake.list_instances(a["zone"], q.get("filter", ""))
        return 200, _page(items, q, {"kind": "compute#instanceList"})

    def _instances_aggregatedList(self, a: dict[str, str], q: dict[str, str],
                                  _: Any) -> tuple[int, Any]:
        scoped: dict[str, Any] = {}
        for zone in self.fake.zones:
            items = self.fake.list_instances(zone, q.get("filter", ""))
            scoped[f"zones/{zone}"] = {"instances": items} if items else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                f"'zones/{zone}' on this page."}}
        return 200, {"kind": "compute#instanceAggregatedList", "items": scoped}

    def _instances_getGuestAttributes(self, a: dict[str, str], q: dict[str, str],
                                      _: Any) -> tuple[int, Any]:
        return 200, self.fake.guest_attributes(a["zone"], a["name"], q.get("queryPath", ""))

    def _test_preempt(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        self.fake.preempt(a["zone"], a["name"])
        return 200, {}

    def _instances_stop(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        op = self.fake.stop_instance(a["zone"], a["name"])
        return 200, op.to_json(time.time())

    def _networks_getEffectiveFirewalls(self, a: dict[str, str], q: dict[str, str],
                                        _: Any) -> tuple[int, Any]:
        """The network's VPC firewall rules (no firewall policies in the fake)."""
        with self.fake._lock:
            rules = self.fake.firewalls.get(a["network"])
        if rules is None:
            raise FakeHttpError(404, f"The resource 'projects/{self.fake.project}/global/"
                                f"networks/{a['network']}' was not found", "notFound",
                                "NOT_FOUND")
        return 200, {"firewalls": [dict(r) for r in rules]}

    def _images_list(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        """The image project's images, deprecated ones included (as the API lists them),
        filtered (`family eq "common-.*-ubuntu-2404.*"`) and paged."""
        with self.fake._lock:
            items = list(self.fake.image_catalogue.get(a["image_project"], []))
        items = [i for i in items if matches_filter(i, q.get("filter", ""))]
        return 200, _page(items, q, {"kind": "compute#imageList"})

    def _images_insert(self, a: dict[str, str], q: dict[str, str],
                       body: dict[str, Any]) -> tuple[int, Any]:
        op = self.fake.insert_image(body)
        return 200, op.to_json(time.time())

    def _images_get(self, a: dict[str, str], q: dict[str, str], _: Any) -> tuple[int, Any]:
        with self.fake._lock:
            image = self.fake.images.get(a["name"])
        if image is None:
            raise FakeHttpError(404, f"The resource 'projects/{self.fake.project}/global/"
                                f"images/{a['name']}' was not found", "notFound", "NOT_FOUND")
        return 200, {"kind": "compute#image", "selfLink": f"{API}/projects/"
                     f"{self.fake.project}/global/images/{a['name']}", **image}

    def _globalOperations_get(self, a: dict[str, str], q: dict[str, str],
                              _: Any) -> tuple[int, Any]:
        return self._zoneOperations_get({**a, "zone": GLOBAL}, q, _)

    def _globalOperations_wait(self, a: dict[str, str], q: dict[str, str],
                               _: Any) -> tuple[int, Any]:
        return self._zoneOperations_wait({**a, "zone": GLOBAL}, q, _)

    def _operation(self, a: dict[str, str]) -> FakeOperation:
        op = self.fake.operations.get((a["zone"], a["op"]))
        if op is None:
            raise FakeHttpError(404, f"The resource 'projects/{self.fake.project}/zones/"
                                f"{a['zone']}/operations/{a['op']}' was not found",
                                "notFound", "NOT_FOUND")
        return op

    def _zoneOperations_get(self, a: dict[str, str], q: dict[str, str],
                            _: Any) -> tuple[int, Any]:
        with self.fake._lock:
            return 200, self._operation(a).to_json(time.time())

    def _zoneOperations_wait(self, a: dict[str, str], q: dict[str, str],
                             _: Any) -> tuple[int, Any]:
        with self.fake._lock:
            op = self._operation(a)
        deadline = time.time() + self.fake.wait_cap_s
        while time.time() < min(deadline, op.done_at):
            time.sleep(min(0.01, max(0.0, op.done_at - time.time())))
        with self.fake._lock:
            return 200, op.to_json(time.time())

    def _zoneOperations_list(self, a: dict[str, str], q: dict[str, str],
                             _: Any) -> tuple[int, Any]:
        with self.fake._lock:
            self.fake._check_zone(a["zone"])
            now = time.time()
            ops = [op.to_json(now) for (zone, _), op in self.fake.operations.items()
                   if zone == a["zone"]]
        items = [o for o in ops if matches_filter(o, q.get("filter", ""))]
        return 200, _page(items, q, {"kind": "compute#operationList"})

    def _metadata_preempted(self, a: dict[str, str], q: dict[str, str],
                            _: Any) -> tuple[int, Any]:
        """The guest's view: `TRUE`/`FALSE`, long-poll with wait_for_change and last_etag."""
        with self.fake._lock:
            inst = self.fake.instances.get((a["zone"], a["name"]))
        if inst is None:
            raise FakeHttpError(404, "no such instance")
        if q.get("wait_for_change", "").lower() == "true":
            timeout = float(q.get("timeout_sec", "60"))
            with inst.watchers:
                inst.watchers.wait_for(lambda: str(inst.preempted_etag) != q.get("last_etag"),
                                       timeout=timeout)
        value = "TRUE" if inst.preempted else "FALSE"
        data = value.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/text")
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("ETag", str(inst.preempted_etag))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        raise _AlreadySent


class _AlreadySent(Exception):
    pass


def _page(items: list[dict[str, Any]], q: dict[str, str], base: dict[str, Any]) -> dict[str, Any]:
    size = int(q.get("maxResults") or 500)
    start = int(q.get("pageToken") or 0)
    page = dict(base, items=items[start:start + size])
    if start + size < len(items):
        page["nextPageToken"] = str(start + size)
    return page


@contextlib.contextmanager
def running_fake(**options: Any) -> Iterator[FakeGce]:
    """`with running_fake(provision_s=...) as fake:` — started and stopped around the block."""
    fake = FakeGce(**options).start()
    try:
        yield fake
    finally:
        fake.stop()
