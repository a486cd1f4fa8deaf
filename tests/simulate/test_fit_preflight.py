"""The exported parameters match a re-fit; preflight catches a job that cannot train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.simulate.fit import PARAMS_FILE, build_params
from orchestrator.simulate.validate import compose


@pytest.mark.slow  # fits every model of analysis/ (≈ 20–50 s on a busy 2-core machine)
def test_committed_parameters_equal_a_refit() -> None:
    assert json.loads(PARAMS_FILE.read_text()) == json.loads(json.dumps(build_params()))


@pytest.mark.slow  # starts TensorFlow in a subprocess (≈ 20–45 s here)
def test_preflight_fails_fast_on_a_job_that_cannot_train(tmp_path: Path) -> None:
    from orchestrator.preflight import PreflightError, run_preflight

    cfg = compose(["+experiment=cifar10_res32", f"job.data_dir={tmp_path}"])  # no CIFAR files
    with pytest.raises(PreflightError, match="no CIFAR files") as err:
        run_preflight(cfg)
    assert "preflight=false" in str(err.value)
    assert "loss" in run_preflight(compose([]))  # the digits default trains its step
