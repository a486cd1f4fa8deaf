"""The login key: the tool's own key pair by default (made on first use, 0600, no passphrase),
a configured key that is missing or encrypted is one line before any VM (audit row 4)."""

from __future__ import annotations

import stat
from pathlib import Path

import paramiko
import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.validate import compose_experiment
from provisioning.base import BadFieldError
from provisioning.gce.keys import ensure_tool_key, tool_key_path
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    fake_fixture,
    make_provider_fixture,
    small_request,
)


@pytest.fixture(name="config_home")
def config_home_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def encrypted_key(directory: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = directory / "id_locked"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"secret")))
    path.chmod(0o600)
    return path


def test_the_tools_own_key_is_made_once_private_and_without_passphrase(config_home: Path) -> None:
    path = ensure_tool_key()
    assert path == config_home / "transient-orchestrator" / "ssh" / "id_ed25519"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert isinstance(paramiko.PKey.from_path(path), paramiko.Ed25519Key)  # no passphrase
    first = path.read_bytes()
    assert ensure_tool_key() == path and path.read_bytes() == first  # reused, not remade
    assert sorted(path.parent.iterdir()) == [path, path.with_suffix(".pub")]  # no temp left


def test_vms_get_the_tools_public_key_by_default(fake: FakeGce, make_provider, config_home: Path,
                                                 tmp_path: Path) -> None:
    assert not tool_key_path().exists()
    provider = make_provider(ssh_key=None)
    cluster = provider.acquire(small_request("key", tmp_path, workers=1))
    try:
        public = paramiko.PKey.from_path(tool_key_path()).get_base64()
        for inst in fake.live_instances():
            items = {i["key"]: i["value"] for i in inst.body["metadata"]["items"]}
            assert items["ssh-keys"] == f"transient:ssh-ed25519 {public}"
        assert provider.vm_of(cluster.hosts[0].id).ssh.cfg.ssh_key_path() == str(tool_key_path())
    finally:
        provider.release(cluster)


@pytest.mark.parametrize("problem", ["encrypted", "missing"])
def test_a_configured_key_that_cannot_log_in_is_one_line_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path, problem: str) -> None:
    key = encrypted_key(tmp_path) if problem == "encrypted" else tmp_path / "nope"
    expected = "passphrase-protected" if problem == "encrypted" else "no such key file"
    with pytest.raises(ConfigError) as info:  # the run's validation, before anything
        compose_experiment("cifar10_res32", [f"provider.ssh_key={key}"])
    line = info.value.line()
    assert line.startswith("config error: provider.ssh_key: ") and expected in line, line
    assert "\n" not in line
    provider = make_provider(ssh_key=str(key))  # and the provider itself refuses
    with pytest.raises(BadFieldError, match=expected):
        provider.acquire(small_request("bad-key", tmp_path, workers=1))
    assert fake.live_instances() == [] and fake.calls["instances.insert"] == 0
