"""The planner answers only what Compute Engine rents (issue 37): each GPU on the machine series
it attaches to, checked by the same `accelerators` the GCE provider and its dry run use, priced
as that machine type plus the GPU; retired GPUs only under the papers' 2019 catalogue."""

from __future__ import annotations

import pytest

from orchestrator.config.validation import validate
from orchestrator.plan import make_plan
from orchestrator.simulate.models import SimModels
from orchestrator.simulate.planner import parse_args
from orchestrator.simulate.planner_candidates import candidates, configure, machine_type_for
from orchestrator.simulate.validate import compose
from provisioning.gce.body import accelerators

QUESTION = ["+experiment=cifar10_res32", "planner.zones=first", "planner.workers=[1]"]


def test_every_rentable_catalog_gpu_gets_a_machine_type_gce_accepts() -> None:
    cfg = compose(parse_args(QUESTION))
    expected = {"l4": "g2-standard-4", "a100": "a2-highgpu-1g", "t4": "n1-standard-4",
                "v100": "n1-standard-4", "p100": "n1-standard-4"}
    for gpu, machine_type in expected.items():
        assert machine_type_for(cfg, gpu) == machine_type
        accelerators(machine_type, gpu)  # raises BadRequestError on a combination GCE refuses


def test_planner_candidates_are_priced_on_their_series_and_leave_out_retired_gpus() -> None:
    cfg = compose(parse_args(QUESTION))
    cands = candidates(cfg, SimModels.load())
    assert cands and "k80" not in {c.gpu for c in cands}  # retired on GCE in 2024
    for c in cands:
        run_cfg = configure(cfg, c)
        group = run_cfg.cluster.worker_groups[0]
        accelerators(group.machine_type, c.gpu)
        validate(run_cfg)
        if c.gpu == "l4":
            assert group.machine_type == "g2-standard-4"
            worker_h = cfg.pricing.hourly_price("g2-standard-4", "l4", c.transient)
            assert make_plan(run_cfg).hourly_usd >= worker_h


@pytest.mark.parametrize("pricing", ["papers_2019"])
def test_the_papers_catalogue_keeps_the_k80(pricing: str) -> None:
    cfg = compose(parse_args([*QUESTION, f"pricing={pricing}"]))
    assert "k80" in {c.gpu for c in candidates(cfg, SimModels.load())}
