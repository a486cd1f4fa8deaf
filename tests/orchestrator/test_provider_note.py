"""What the user is told when the provider cannot honour the plan: a GPU cluster on `local`.

The note comes from the backend (`Provider.plan_note`, `Provider.billed`), so the display has
no provider-specific branch: a billed backend registered here gets no note and a plain price.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.display import cost_text, provider_note, render_plan, say_provider_note
from orchestrator.plan import BackendTraits, make_plan
from orchestrator.validate import compose_experiment
from provisioning import registry
from provisioning.base import Provider

GPU_NOTE = "local: GPUs (k80, p100, v100) are simulated as CPU processes on this machine"


def _printed(fn, *args, **kwargs) -> str:
    console = Console(file=io.StringIO(), width=400)
    fn(*args, console, **kwargs)
    return console.file.getvalue()


def test_gpu_cluster_on_local_says_what_is_simulated_and_what_prices_mean() -> None:
    plan = make_plan(compose_experiment("mixed_gpu_cifar10", ["provider=local"]))
    note = provider_note(plan)
    assert note is not None and note.startswith(GPU_NOTE)
    assert "machine types and zones are not used" in note
    assert "prices (catalog papers_2019) are what this cluster would cost in the cloud" in note
    out = _printed(render_plan, plan)
    assert out.count("note: ") == 1 and GPU_NOTE in out
    text = cost_text(1.2345, plan)
    assert text == "$1.2345 if run in the cloud (catalog papers_2019; local: nothing billed)"


def test_cpu_cluster_on_local_names_no_gpus() -> None:
    plan = make_plan(compose_experiment("digits_local"))
    note = provider_note(plan)
    assert note is not None and note.startswith("local: every host is a process on this machine")
    assert "GPU" not in note and "zones" not in note  # local_cpu names neither


def test_a_sweep_says_the_note_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.display as display

    monkeypatch.setattr(display, "_notes_said", set())  # other tests in this process said it
    plan = make_plan(compose_experiment("digits_local", ["cluster.workers=1"]))
    console = Console(file=io.StringIO(), width=400)
    for _ in range(3):
        say_provider_note(plan, console, once=True)
    assert console.file.getvalue().count("note: ") == 1


class _CloudStandIn(Provider):
    """A backend that provisions what it is asked and bills it (the defaults of Provider)."""

    name = "cloud-test"

    def acquire(self, request):  # never built: only its class is asked
        raise NotImplementedError

    runner = poll = replace = release = acquire


@pytest.fixture
def cloud_backend() -> Iterator[str]:
    registry.register_provider(_CloudStandIn.name, _CloudStandIn)
    yield _CloudStandIn.name
    registry.unregister_provider(_CloudStandIn.name)


def test_a_billed_backend_gets_no_note_and_a_plain_price(cloud_backend: str) -> None:
    cfg = compose_experiment("mixed_gpu_cifar10")
    plan = make_plan(cfg)
    plan.provider, plan.backend = cloud_backend, BackendTraits.of(cloud_backend, cfg.pricing)
    assert provider_note(plan) is None
    assert "note:" not in _printed(render_plan, plan)
    assert cost_text(0.5, plan) == "$0.5000 (catalog papers_2019)"


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_local_run_of_a_gpu_cluster_says_so_and_prices_honestly(repo_root: Path,
                                                                 tmp_path: Path) -> None:
    """The GPU experiment, made small (digits instead of CIFAR-10), run for real on local."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=mixed_gpu_cifar10", "provider=local",
         "job=digits_cnn", "job.train_steps=200", "progress=false",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())  # rich wraps long lines
    assert out.count("note: ") == 1 and GPU_NOTE in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["workers"] == 4
    closing = f"${summary['cost_usd']:.4f} if run in the cloud (catalog papers_2019; local: nothing billed)"
    assert closing in out
    assert "on GCE" not in out
