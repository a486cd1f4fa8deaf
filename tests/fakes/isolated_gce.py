"""The fake Compute API whose VMs are isolated hosts (`IsolatedFakeGce`), and the settings every
run on it uses (`provider_args`, `FAKE_TIMES`, `ZONES`): shared by the tests (tests/provisioning/
gce_fixtures.py, baked_image.py, tests/testbed/baked.py) and the benchmark (bench/
cloud_transfer.py), so it imports nothing of pytest."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes.gce_server import FakeGce, FakeHttpError, FakeInstance, FakeOperation
from tests.testbed.isolated import Disk, IsolatedHost, IsolatedTestBed

# conf/provider/gce.yaml's zone order; the headline stocks the first out.
ZONES = ("us-west1-b", "us-west1-a", "us-central1-a", "us-central1-b")
FAMILY = ("debian-cloud", "debian-13")  # Python 3.13: not the orchestrator's minor
#: the fake's timings, fast (every run on isolated hosts uses these)
FAKE_TIMES: dict[str, float] = {"provision_s": 0.2, "staging_s": 0.2, "insert_op_s": 0.1,
                                "delete_op_s": 0.2, "stop_s": 0.2, "wait_cap_s": 1.0}

#: Image families the fake's isolated VMs boot: an image family names a root filesystem of
#: tests/testbed/images.py (as `debian-cloud`'s families name Debian releases).
IMAGE_FAMILIES = {"debian-12": "bookworm", "debian-13": "trixie"}


class IsolatedFakeGce(FakeGce):
    """The fake Compute API whose VMs are isolated hosts of `bed` (tests/testbed/isolated.py):
    a created VM boots a host with a fresh disk from the image its boot disk names; at boot
    the guest agent makes the accounts of its `ssh-keys` metadata and runs its
    `startup-script` as root; it publishes the host key the host made at first boot as guest
    attributes once booted, and refuses logins (pam_nologin) until `login_refused_s` after
    RUNNING. Its metadata server is `http://metadata.google.internal/computeMetadata/v1`, as on
    GCE (the bridge's address, port 80, answering for the VM by its source address, with
    `Metadata-Flavor: Google` required). A deleted or preempted VM's host is powered off when
    it leaves STOPPING (`stop_s` later: a preempted VM's watcher has that long to see the
    flag); a preempted VM with the STOP action keeps its disk, which `image_from_instance`
    turns into a custom image (`images.insert` from a VM's disk), bootable by `sourceImage`.

    `vms` hosts are made (stopped) up front, one per address the fake hands out. Image families
    not in `families` are refused with the cloud's 404, unless `default_image` names an image
    for them (e.g. the provider's default Deep Learning VM family in a test). Errors while a
    VM boots are kept in `boot_errors` (ip -> message); such a VM never publishes host keys."""

    def __init__(self, bed: IsolatedTestBed, vms: int, families: dict[str, str] | None = None,
                 default_image: str | None = None, login_refused_s: float = 2.0,
                 **options: Any) -> None:
        self.bed = bed
        self.families = dict(IMAGE_FAMILIES if families is None else families)
        self.default_image = default_image
        self.custom_images: dict[str, Disk] = {}  # "projects/P/global/images/NAME" -> disk
        self.boot_errors: dict[str, str] = {}
        self.slots: dict[str, IsolatedHost] = {}
        for _ in range(vms):
            host = bed.add_host(start=False)
            self.slots[host.address] = host
        self._slot_locks = {ip: threading.Lock() for ip in self.slots}
        self._booted: dict[str, FakeInstance] = {}  # ip -> the VM its host runs (or ran)
        self._metadata: ThreadingHTTPServer | None = None
        super().__init__(ip_pool=list(self.slots), on_gone=self._vm_leaving, **options)
        self.login_refused_s = login_refused_s

    def start(self) -> IsolatedFakeGce:
        super().start()
        handler = type("MetadataHandler", (_MetadataServer,), {"fake": self})
        self._metadata = ThreadingHTTPServer((self.bed.gateway, 80), handler)
        self._metadata.daemon_threads = True
        threading.Thread(target=self._metadata.serve_forever, name="fake-gce-metadata",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.shutdown()
            self._metadata.server_close()
            self._metadata = None
        super().stop()

    def __enter__(self) -> IsolatedFakeGce:
        return self.start()

    def host_of(self, zone: str, name: str) -> IsolatedHost:
        """The isolated host a live VM runs on."""
        return self.slots[self._instance(zone, name).ip]

    def assert_hosts_off(self, within_s: float = 10.0) -> None:
        """Every VM's host is powered off within `within_s` (deleting a VM stops its host a
        moment later)."""
        deadline = time.monotonic() + within_s
        while any(h.running for h in self.slots.values()):
            assert time.monotonic() < deadline, [h.name for h in self.slots.values()
                                                 if h.running]
            time.sleep(0.2)

    def disk_for(self, source_image: str) -> Disk:
        """The disk a VM created from `source_image` (a family or a custom image URL) boots."""
        path = source_image.split("/compute/v1/", 1)[-1]
        if "/images/family/" in path:
            family = path.rsplit("/", 1)[1]
            image = self.families.get(family, self.default_image)
            if image is not None:
                return Disk(image)
        else:
            name = path.rsplit("/", 1)[-1]
            for url, disk in self.custom_images.items():
                if url.rsplit("/", 1)[1] == name:
                    return disk
        raise FakeHttpError(404, f"The resource '{path}' was not found", "notFound",
                            "NOT_FOUND")

    def add_image(self, name: str, disk: Disk) -> str:
        """Make `disk` (e.g. a baked image cached on this machine, tests/testbed/baked.py) the
        project's custom image `name`, as if `images.insert` had made it here; its URL."""
        url = f"projects/{self.project}/global/images/{name}"
        with self._lock:
            self.custom_images[url] = disk
            self.images[name] = {"name": name, "status": "READY"}
        return url

    def image_from_instance(self, zone: str, instance: str, image: str) -> str:
        """A custom image from a stopped (TERMINATED) VM's disk; returns its URL
        (projects/P/global/images/NAME)."""
        inst = self._instance(zone, instance)
        if inst.status(time.time(), self.stop_s) != "TERMINATED":
            raise FakeHttpError(400, f"The disk of instance '{instance}' is in use: stop the "
                                "instance first", "resourceInUseByAnotherResource")
        url = f"projects/{self.project}/global/images/{image}"
        if url in self.custom_images:
            raise FakeHttpError(409, f"The resource '{url}' already exists", "alreadyExists",
                                "ALREADY_EXISTS")
        self._power_off(inst.ip, inst)  # TERMINATED: off, even if its timer has not fired yet
        with self._slot_locks[inst.ip]:
            self.custom_images[url] = self.bed.snapshot(self.slots[inst.ip])
        return url

    def import_image(self, url: str, disk: Disk) -> None:
        """Know a custom image another fake of the bed made (`images.insert` there), as if it
        had been made here: one bake serves a session's fakes (tests/provisioning/
        baked_image.py)."""
        path = url.split("/compute/v1/", 1)[-1]
        name = path.rsplit("/", 1)[1]
        with self._lock:
            self.custom_images[f"projects/{self.project}/global/images/{name}"] = disk
            self.images[name] = {"name": name, "status": "READY"}

    def insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> FakeOperation:
        disks = body.get("disks") or [{}]
        source = disks[0].get("initializeParams", {}).get("sourceImage", "")
        disk = self.disk_for(source)  # an unknown image: the cloud's synchronous 404
        op = super().insert(zone, body, request_id)
        inst = self.instances.get((zone, body.get("name", "")))
        if op.error is None and inst is not None and inst.ip not in self.slots:
            self.boot_errors[inst.ip] = f"no isolated host at {inst.ip} (networkIP not ours)"
        elif op.error is None and inst is not None and self._booted.get(inst.ip) is not inst:
            self._booted[inst.ip] = inst
            inst.host_keys = []  # published by the guest once the host has booted
            threading.Thread(target=self._boot, args=(inst, disk), daemon=True,
                             name=f"fake-vm-{inst.name}").start()
        return op

    def _boot(self, inst: FakeInstance, disk: Disk) -> None:
        host = self.slots[inst.ip]
        metadata = inst.metadata()
        accounts = {}
        for line in metadata.get("ssh-keys", "").splitlines():
            user, sep, key = line.partition(":")
            if sep and key.strip():
                accounts[user.strip()] = key.strip()
        with self._slot_locks[inst.ip]:
            if inst.deleting_at is not None or inst.stopped_at is not None:
                return  # deleted before it booted
            try:
                self.bed.stop(host)
                self.bed.reimage(host, disk, accounts or None,
                                 startup_script=metadata.get("startup-script"),
                                 names={"metadata.google.internal": self.bed.gateway})
                host.boot_s = max(0.0, inst.running_since() - time.time()) + self.login_refused_s
                self.bed.start(host)
            except Exception as err:  # reported through boot_errors
                self.boot_errors[inst.ip] = f"{type(err).__name__}: {err}"
                return
            kind, blob = host.host_key.split()[:2]
            inst.host_keys.append((kind, blob))

    def _vm_leaving(self, ip: str) -> None:
        """on_gone: the VM is STOPPING; its host goes off when that ends."""
        timer = threading.Timer(self.stop_s, self._power_off, args=(ip, self._booted.get(ip)))
        timer.daemon = True
        timer.start()

    def _power_off(self, ip: str, inst: FakeInstance | None) -> None:
        host = self.slots.get(ip)
        if host is None:
            return
        with self._slot_locks[ip]:
            if self._booted.get(ip) is inst:  # not a new VM at the same address since
                self.bed.stop(host)


class _MetadataServer(BaseHTTPRequestHandler):
    """GCE's metadata server as the isolated VMs see it: it knows the VM by the request's
    source address and answers from the fake's per-instance metadata endpoints."""

    fake: IsolatedFakeGce
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        inst = self.fake._booted.get(self.client_address[0])
        prefix = "/computeMetadata/v1"
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, b"Missing Metadata-Flavor:Google header.", {})
            return
        if inst is None or not self.path.startswith(prefix + "/"):
            self._reply(404, b"Not found", {})
            return
        url = self.fake.metadata_url(inst.zone, inst.name) + self.path[len(prefix):]
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                status, body, headers = reply.status, reply.read(), reply.headers
        except urllib.error.HTTPError as err:
            status, body, headers = err.code, err.read(), err.headers
        except OSError:
            status, body, headers = 503, b"metadata server unavailable", None
        self._reply(status, body, headers or {})

    def _reply(self, status: int, body: bytes, headers: Any) -> None:
        # A long poll's VM may be powered off before its answer: the asker is gone, as on GCE.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            for name in ("Content-Type", "ETag"):
                if headers.get(name):
                    self.send_header(name, headers[name])
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


def provider_args(fake: IsolatedFakeGce, bed: IsolatedTestBed) -> list[str]:
    """The fake cloud and its VMs' facts: the endpoint, anonymous credentials, the bed's key,
    the base family, and the fake's GPUs being labels (test_gce_headline's docstring). Faster
    polls. No provider.python, ssh_user or remote_root: the VMs are isolated hosts."""
    return [f"provider.api_endpoint={fake.endpoint}", "provider.credentials=anonymous",
            f"provider.project={fake.project}", f"provider.ssh_key={bed.client_key}",
            f"provider.image_project={FAMILY[0]}", f"provider.image_family={FAMILY[1]}",
            "provider.extra=cpu", "provider.gpu_check=false",
            "provider.poll_interval_s=0.5", "provider.ready_poll_s=0.1",
            "provider.host_key_poll_s=0.2"]
