"""Typed per-backend provider configs and the capability check at validation time."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.config.transient import RevocationModel
from orchestrator.config.validation import validate_provider
from orchestrator.validate import compose_experiment
from provisioning.base import (
    DATA_DIR_FIELD,
    BadFieldError,
    ProviderConfig,
    ProvisionError,
    url_scheme,
)
from provisioning.local import LocalProvider, LocalProviderConfig
from provisioning.registry import (
    backend,
    dataset_reader,
    provider_class,
    register_provider,
    unregister_provider,
)


class NoRevokeProvider(LocalProvider):
    """A backend like a cloud without on-demand revocation (registered for this test only)."""

    name = "norevoke"
    can_revoke = False


@pytest.fixture
def norevoke() -> Iterator[str]:
    register_provider("norevoke", NoRevokeProvider, ProviderConfig)
    yield "norevoke"
    unregister_provider("norevoke")  # the registry is global: leave it as found


class VaultProvider(LocalProvider):
    """A backend with datasets and credentials of its own (registered for these tests only):
    `vault://NAME` and `gs://BUCKET/NAME` are folders under `SHELF`, copied into the cache."""

    name = "vault"
    dataset_schemes = ("vault", "gs")
    SHELF: Path = Path("/nonexistent")

    @classmethod
    def check_credentials(cls, config: ProviderConfig) -> tuple[str, str] | None:
        return ("provider.name", "no vault token here; run `vault login`")

    @classmethod
    def fetch_dataset(cls, url: str, cache_root: Path, download: bool = True) -> Path:
        if url_scheme(url) not in cls.dataset_schemes:
            return super().fetch_dataset(url, cache_root, download)
        name = url.rsplit("/", 1)[-1]
        folder = Path(cache_root) / "vault" / name
        if download:
            if not (cls.SHELF / name).is_dir():
                raise ProvisionError(f"the vault holds no {name!r}")
            shutil.copytree(cls.SHELF / name, folder, dirs_exist_ok=True)
        return folder


@pytest.fixture
def vault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(VaultProvider, "SHELF", tmp_path / "shelf")
    register_provider("vault", VaultProvider, ProviderConfig)
    yield "vault"
    unregister_provider("vault")


def test_provider_local_composes_against_its_own_schema():
    cfg = compose_experiment("digits_local", ["provider.provision_delay_s=0.5"])
    assert isinstance(cfg.provider, LocalProviderConfig)
    assert cfg.provider.provision_delay_s == 0.5
    assert backend("local").config is LocalProviderConfig


def test_a_key_of_another_backend_is_a_config_error_naming_it():
    with pytest.raises(ConfigError) as info:
        compose_experiment("digits_local", ["+provider.hosts=[]"])
    assert info.value.line().startswith("config error: provider.hosts: ")


def test_revocations_on_a_backend_that_cannot_revoke_fail_validation(norevoke: str):
    cfg = compose_experiment("transient_digits")
    assert cfg.revocation.model != RevocationModel.none
    cfg = dataclasses.replace(cfg, provider=ProviderConfig(name=norevoke))
    with pytest.raises(ConfigError) as info:
        validate_provider(cfg)
    assert info.value.line() == (
        "config error: revocation.model: provider 'norevoke' cannot revoke hosts on demand "
        "(use revocation=none, or a provider that can (local))")
    validate_provider(dataclasses.replace(
        cfg, revocation=dataclasses.replace(cfg.revocation, model=RevocationModel.none)))


def test_a_dataset_url_goes_to_the_run_backend_first_then_to_the_one_reading_its_scheme(
        vault: str, tmp_path: Path) -> None:
    assert dataset_reader(str(tmp_path), "local") is LocalProvider  # a folder: the run's own
    assert dataset_reader("gs://bucket/x", vault) is VaultProvider  # the run's backend reads gs
    assert dataset_reader("gs://bucket/x", "local") is provider_class("gce")  # as before
    with pytest.raises(BadFieldError) as error:
        dataset_reader("s3://bucket/x", "local")
    assert error.value.field == DATA_DIR_FIELD
    assert error.value.problem.startswith("no provider reads s3:// URLs, only ")
    assert "gs:// (gce)" in error.value.problem and "vault:// (vault)" in error.value.problem


def test_the_run_start_asks_the_backend_for_credentials_and_its_dataset(
        vault: str, tmp_path: Path) -> None:
    """The orchestrator's run-start steps through the hooks: the credentials problem is one
    config error naming the field; the dataset is fetched into the cache by the backend whose
    scheme it is; one the backend cannot fetch is one data error line."""
    from orchestrator.config.validation import validate_run_start
    from orchestrator.runtime import data as data_step
    from tests.provisioning.test_gce_storage import cifar10_bin, read_tree

    def config(url: str):  # type: ignore[no-untyped-def]
        cfg = compose_experiment("digits_local", ["job.problem=image_cifar10",
                                                  f"job.data_dir={url}"])
        cfg = dataclasses.replace(cfg, provider=ProviderConfig(name=vault))
        cfg.data_cache = str(tmp_path / "cache")
        return cfg

    with pytest.raises(ConfigError) as info:
        validate_run_start(config("vault://cifar10"))
    assert info.value.line() == "config error: provider.name: no vault token here; run `vault login`"
    validate_run_start(compose_experiment("digits_local"))  # local: nothing to check

    files = cifar10_bin(tmp_path / "shelf" / "cifar10", records=4)
    cfg = config("vault://cifar10")
    assert data_step.describe(cfg) == (f"image_cifar10 from vault://cifar10: the run first "
                                       f"downloads what {tmp_path / 'cache/vault/cifar10'} lacks")
    folder = data_step.prepare(cfg)
    assert folder == tmp_path / "cache" / "vault" / "cifar10" and cfg.job.data_dir == str(folder)
    assert read_tree(folder) == files

    with pytest.raises(data_step.DataError) as failed:
        data_step.prepare(config("vault://missing"))
    assert failed.value.line() == ("data error: cannot download vault://missing: the vault "
                                   "holds no 'missing'")
