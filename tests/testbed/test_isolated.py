"""The isolated test hosts themselves (tests/testbed/isolated.py): each image boots as a bare
cloud VM would, hosts share nothing with the test machine or each other, they reach the bed's
package index and nothing else, and nothing is left behind, also when the test process dies.

Real containers from real Debian images, real sshd, real ssh client with a strict known_hosts.
Skipped loudly when this machine cannot run them (not root, no debootstrap).
"""
# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.testbed import isolated, wheelhouse
from tests.testbed.isolated import IsolatedHost, IsolatedTestBed
from tests.testbed.isolated_fixtures import module_isolated_bed  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bed(module_isolated_bed: IsolatedTestBed) -> IsolatedTestBed:
    for image in ("bookworm", "trixie", "bookworm"):
        module_isolated_bed.add_host(image=image)
    return module_isolated_bed


def run(bed: IsolatedTestBed, host: IsolatedHost, command: str, user: str | None = None) -> str:
    """`command`'s stdout on `host`; fails the test on a non-zero exit."""
    result = bed.ssh(host, command, user=user)
    assert result.returncode == 0, f"{host.name}: {command!r} -> {result.returncode} {result.stderr}"
    return result.stdout


@pytest.mark.parametrize(("index", "python"), [(0, "3.11"), (1, "3.13")])
def test_each_image_is_a_bare_cloud_image(bed: IsolatedTestBed, index: int, python: str) -> None:
    host = bed.hosts[index]
    assert run(bed, host, "python3 --version").startswith(f"Python {python}.")
    assert run(bed, host, "id -un").strip() == "cloud"
    assert run(bed, host, "sudo -n id -u").strip() == "0"  # passwordless sudo
    assert run(bed, host, "hostname").strip() == host.name
    missing = bed.ssh(host, "python3 -c 'import tensorflow'")
    assert missing.returncode != 0 and "No module named 'tensorflow'" in missing.stderr
    # its own host key, made at its first boot, checked strictly by the client
    assert host.host_key.startswith("ssh-ed25519 ")
    assert len({h.host_key for h in bed.hosts}) == len(bed.hosts)


def test_hosts_share_nothing_with_the_test_machine_or_each_other(bed: IsolatedTestBed) -> None:
    a, b = bed.hosts[0], bed.hosts[2]
    run(bed, a, "echo mine > ~/only-on-a && sudo touch /etc/only-on-a")
    assert run(bed, b, "ls ~/only-on-a /etc/only-on-a 2>/dev/null; true") == ""
    # processes: the host's own only (its sshd, this session, ps)
    commands = set(run(bed, a, "ps -e -o comm=").split())
    assert commands <= {"sshd", "bash", "sh", "ps"}, commands
    # files: none of the test machine's project, interpreter or virtualenv
    for path in (REPO_ROOT, Path(sys.executable).resolve(), Path(sys.prefix), Path("/work")):
        assert bed.ssh(a, f"test -e {path}").returncode == 1, f"{path} visible on {a.name}"
    # network: its own link and the bed's subnet, no default route
    routes = run(bed, a, "ip -4 route").strip().splitlines()
    assert routes == [f"{bed.gateway.rsplit('.', 1)[0]}.0/24 dev eth0 proto kernel scope link "
                      f"src {a.address}"], routes
    links = run(bed, a, "ip -o link show | awk -F': ' '{print $2}'").split()
    assert sorted(link.split("@")[0] for link in links) == ["eth0", "lo"]
    # an address off the subnet is unreachable at once: no route, nothing is sent
    probe = "import socket; socket.create_connection(('192.0.2.1', 80), timeout=5)"
    unreachable = bed.ssh(a, f'python3 -c "{probe}"')
    assert unreachable.returncode != 0 and "Network is unreachable" in unreachable.stderr


def test_logins_are_refused_while_the_host_boots(bed: IsolatedTestBed) -> None:
    host = bed.add_host(image="trixie", boot_s=3600)  # boots until told otherwise
    try:
        refused = bed.ssh(host, "true")
        assert refused.returncode == 255
        assert "by PAM account configuration" in host.log.read_text()  # pam_nologin said no
        bed.finish_boot(host)
        assert run(bed, host, "echo in").strip() == "in"
        # a timed boot: no login succeeds before boot_s has passed inside the host
        bed.stop(host)
        host.boot_s = 1
        bed.start(host)
        assert bed.wait_login(host) >= 1
    finally:
        bed.stop(host)


def test_a_host_keeps_its_disk_across_restarts_and_a_fresh_disk_is_new(
        bed: IsolatedTestBed) -> None:
    host = bed.add_host()
    try:
        run(bed, host, "echo kept > ~/state")
        key = host.host_key
        bed.restart(host)
        assert host.host_key == key
        assert run(bed, host, "cat ~/state").strip() == "kept"
        bed.restart(host, fresh_disk=True)
        assert host.host_key != key  # a recreated VM: the pinned known_hosts line follows
        assert run(bed, host, "ls ~").strip() == ""
    finally:
        bed.stop(host)


def test_a_stopped_hosts_disk_becomes_an_image(bed: IsolatedTestBed) -> None:
    """A baked image: what one host wrote is on every host made from its snapshot; each makes
    its own host key; a file the snapshot deleted from the base stays deleted."""
    source = bed.add_host(image="trixie")
    run(bed, source, "sudo mkdir /opt/runtime && echo baked | sudo tee /opt/runtime/marker"
                     " && sudo rm /etc/motd")
    bed.stop(source)
    disk = bed.snapshot(source)
    assert disk.image == "trixie" and len(disk.layers) == 1
    made = [bed.add_host(disk=disk) for _ in range(2)]
    try:
        for host in made:
            assert run(bed, host, "cat /opt/runtime/marker").strip() == "baked"
            assert bed.ssh(host, "test -e /etc/motd").returncode == 1
            assert host.host_key != source.host_key
        assert made[0].host_key != made[1].host_key
    finally:
        for host in made:
            bed.stop(host)


def test_hosts_install_from_the_beds_package_index(bed: IsolatedTestBed) -> None:
    """The index on the bridge serves a wheelhouse made for the host's Python (3.13 here, not
    the test machine's); the host's own pip installs from it into a venv."""
    wheels = wheelhouse.wheelhouse(["six==1.17.0"], "3.13")
    url = bed.serve_index(wheels)
    pip = f"~/venv/bin/pip install -q --index-url {url} --trusted-host {bed.gateway}"  # http
    host = bed.hosts[1]
    out = run(bed, host, f"python3 -m venv ~/venv && {pip} six==1.17.0"
                         " && ~/venv/bin/python -c 'import six; print(six.__version__)'")
    assert out.strip().splitlines()[-1] == "1.17.0"
    missing = bed.ssh(host, f"{pip} no-such-package-xyz")
    assert missing.returncode != 0  # the index serves what is in the wheelhouse, nothing more


def test_the_guest_agent_creates_the_metadata_accounts(bed: IsolatedTestBed) -> None:
    """As on a cloud VM: a user named in the instance's ssh-keys exists after boot, with the
    key authorized and passwordless sudo; the image's own user is not authorized."""
    key = bed.client_key.with_suffix(".pub").read_text()
    host = bed.add_host(image="trixie", accounts={"alice": key})
    try:
        assert host.user == "alice"
        assert run(bed, host, "id -un; sudo -n id -un").split() == ["alice", "root"]
        assert bed.ssh(host, "true", user="cloud").returncode == 255
    finally:
        bed.stop(host)


@pytest.mark.isolated  # builds its own isolated hosts (no fixture marks it)
def test_teardown_leaves_nothing() -> None:
    reason = isolated.skip_reason()
    if reason:
        pytest.skip(reason)
    bed = IsolatedTestBed(hosts=2, image="trixie")
    bed.serve_index(wheelhouse.wheelhouse(["six==1.17.0"], "3.13"))
    namespaces = [h.pidns for h in bed.hosts]
    bed.close()
    assert bed.leftovers() == []
    assert not _processes_in(namespaces)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(bed.dir) not in mounts  # the hosts' mounts lived in their own namespaces


@pytest.mark.isolated  # builds its own isolated hosts (no fixture marks it)
def test_hosts_die_with_a_sigkilled_test_process_and_are_swept_later() -> None:
    reason = isolated.skip_reason()
    if reason:
        pytest.skip(reason)
    script = textwrap.dedent("""
        import json, sys, time
        from tests.testbed.isolated import IsolatedTestBed
        bed = IsolatedTestBed(hosts=2, image="bookworm")
        print(json.dumps({"tag": bed.tag, "pidns": [h.pidns for h in bed.hosts]}), flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        state = json.loads(child.stdout.readline())
        assert _processes_in(state["pidns"])  # they run while the test process lives
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    while _processes_in(state["pidns"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_in(state["pidns"]), "hosts outlived their test process"
    assert isolated._leftovers(state["tag"]), "expected the dead bed's links until a sweep"
    isolated.sweep_stale()  # (another bed starting now may sweep it first: also fine)
    assert isolated._leftovers(state["tag"]) == []
    assert not (isolated._beds_dir() / state["tag"]).exists()


def _processes_in(namespaces: list[str]) -> list[int]:
    return isolated.live_processes(namespaces)
