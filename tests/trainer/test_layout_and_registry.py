"""The wire-facts module and the registry helper every "select by name" table uses."""

from __future__ import annotations

import pytest

from orchestrator.transient.recovery import get_recovery_policy
from provisioning.base import BadRequestError
from provisioning.registry import get_provider
from trainer.layout import RunLayout
from trainer.registry import Registry, UnknownNameError


def test_registry_lists_the_valid_names_in_its_one_error():
    shapes: Registry[int] = Registry("shape")
    shapes.register("square", 4)
    shapes.register("triangle", 3)
    assert shapes.get("square") == 4 and "triangle" in shapes and shapes.names() == [
        "square", "triangle"]
    with pytest.raises(UnknownNameError, match=r"unknown shape 'circle' \(square, triangle\)"):
        shapes.get("circle")


def test_project_registries_raise_the_same_error_type():
    from orchestrator.config.transient import RecoveryConfig

    with pytest.raises(UnknownNameError):
        get_recovery_policy("failover", RecoveryConfig())
    with pytest.raises(UnknownNameError) as info:
        get_provider("azure")
    assert isinstance(info.value, BadRequestError)  # and a bad request to provisioning


def test_run_layout_puts_every_file_below_the_root_unless_a_store_is_named():
    layout = RunLayout(".")
    assert (layout.spec, layout.control, layout.checkpoints, layout.done) == (
        "./trainer_spec.json", "./control.json", "./checkpoints", "./checkpoints/DONE")
    assert layout.tensorboard("eval") == "./tensorboard/eval"
    stored = RunLayout("/host/run", checkpoint_dir="/orchestrator/run/checkpoints")
    assert stored.done == "/orchestrator/run/checkpoints/DONE"
