"""The exported parameters match a re-fit; preflight catches a job that cannot train."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.simulate.fit import PARAMS_FILE, build_params
from orchestrator.simulate.validate import compose


def same(committed: Any, refit: Any, path: str = "") -> list[str]:
    """Where the two differ; floats to 1e-5 relative: the Weibull fits of lifetimes that were
    mostly not revoked (ICAC'19 V100: λ ≈ 720 h) end their optimisation a few 1e-6 apart from
    one machine to another."""
    if isinstance(committed, dict) and isinstance(refit, dict):
        return [d for k in sorted(set(committed) | set(refit))
                for d in same(committed.get(k), refit.get(k), f"{path}.{k}")]
    if isinstance(committed, list) and isinstance(refit, list) and len(committed) == len(refit):
        return [d for i, (a, b) in enumerate(zip(committed, refit, strict=True))
                for d in same(a, b, f"{path}[{i}]")]
    if isinstance(committed, float) and isinstance(refit, float):
        return [] if math.isclose(committed, refit, rel_tol=1e-5) else [f"{path}: {committed} "
                                                                        f"!= {refit}"]
    return [] if committed == refit else [f"{path}: {committed!r} != {refit!r}"]


@pytest.mark.slow  # fits every model of analysis/ (≈ 20–50 s on a busy 2-core machine)
def test_committed_parameters_equal_a_refit() -> None:
    assert same(json.loads(PARAMS_FILE.read_text()), json.loads(json.dumps(build_params()))) == []


def test_fit_command_answers_help_without_fitting_or_writing(tmp_path: Path) -> None:
    """`--help` is answered, not taken for the file to write (which re-fitted for 20 s and
    left a file named `--help` in the current folder)."""
    done = subprocess.run([sys.executable, "-m", "orchestrator.simulate.fit", "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m orchestrator.simulate.fit [-h] [--version] [path]" in done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # starts TensorFlow in a subprocess (≈ 20–45 s here)
def test_preflight_fails_fast_on_a_job_that_cannot_train(tmp_path: Path) -> None:
    from orchestrator.preflight import PreflightError, run_preflight

    cfg = compose(["+experiment=cifar10_res32", f"job.data_dir={tmp_path}"])  # no CIFAR files
    with pytest.raises(PreflightError, match="no CIFAR files") as err:
        run_preflight(cfg)
    assert "preflight=false" in str(err.value)
    assert "loss" in run_preflight(compose([]))  # the digits default trains its step
