"""Typed per-backend provider configs and the capability check at validation time."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.config.transient import RevocationModel
from orchestrator.config.validation import validate_provider
from orchestrator.validate import compose_experiment
from provisioning.base import ProviderConfig
from provisioning.local import LocalProvider, LocalProviderConfig
from provisioning.registry import backend, register_provider, unregister_provider


class NoRevokeProvider(LocalProvider):
    """A backend like a cloud without on-demand revocation (registered for this test only)."""

    name = "norevoke"
    can_revoke = False


@pytest.fixture
def norevoke() -> Iterator[str]:
    register_provider("norevoke", NoRevokeProvider, ProviderConfig)
    yield "norevoke"
    unregister_provider("norevoke")  # the registry is global: leave it as found


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
