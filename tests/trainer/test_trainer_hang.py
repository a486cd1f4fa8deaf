"""Three workers, one hung at a time for longer than the chief's own timeouts, ASP then BSP.

Real multi-process training on digits (1 PS + 3 workers + the chief). The run is long on
purpose (its end is not the point): ASP with the automatic steps per closure (so the
unrolled closure is traced and scheduled while a worker may hang), worker 2 hung for longer
than the heartbeat's naming and the chief's own waits; then the orchestrator's control
switches to BSP in place and worker 0 hangs the same way. In both, the global step must go
on while the worker is stopped: steps and checkpoints reported between its naming and its
SIGCONT (a count of reports, not a rate: the machine may be loaded). The chief is killed at
the end with the cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import (
    HUNG_S,
    LocalCluster,
    hang,
    make_spec,
    reported_between,
    serving_cluster,
    wait_for_closures_settled,
)

from trainer.spec import PhaseSpec

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]
WORKERS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with serving_cluster(tmp_path_factory.mktemp("servers3"), WORKERS, ready_s=120) as local:
        yield local


def test_three_workers_train_on_while_one_hangs_under_asp_and_bsp(cluster: LocalCluster,
                                                                 tmp_path: Path) -> None:
    run_dir = tmp_path / "hang3"
    spec = make_spec(run_dir, WORKERS, [PhaseSpec("asp", 10 ** 7)], checkpoint_frequency=150,
                     steps_per_closure=0)
    spec.cluster = cluster.spec.cluster
    path = spec.to_json(run_dir / "trainer_spec.json")
    chief = cluster.start("chief", 0, path)
    deadline_s = 240  # the chief's start-up and its first steps, on a loaded machine
    wait_for_closures_settled(chief, "asp", deadline_s)  # K chosen, traced, in use
    workers = {s.name: s for s in cluster.servers}

    # ASP: worker 2 hangs; the other two train on, through checkpoints
    silent, stopped, resumed = hang(chief, workers["worker2"], 2, HUNG_S)
    window = reported_between(chief, silent["time"], resumed)
    print(f"ASP, 3 workers: worker 2 named {silent['time'] - stopped:.1f} s after SIGSTOP, "
          f"stopped {resumed - stopped:.1f} s; reported after it was named: {window}")
    steps = [step for _, step in window]
    assert steps and max(steps) - min(steps) >= 12, (window, chief.tail())
    assert "checkpoint" in dict(window), (window, chief.tail())

    # BSP, switched in place by the orchestrator's control; worker 0 hangs
    control = Path(spec.control_path)
    control.with_suffix(".tmp").write_text(json.dumps({"seq": 1, "protocol": "bsp"}))
    control.with_suffix(".tmp").replace(control)
    switch = chief.wait_event("protocol_switch", timeout=60)
    assert switch["to"] == "bsp", switch
    wait_for_closures_settled(chief, "bsp")
    silent, stopped, resumed = hang(chief, workers["worker0"], 0, HUNG_S)
    reported = [s for _, s in reported_between(chief, silent["time"], resumed, ("step",))]
    print(f"BSP, 3 workers: worker 0 named {silent['time'] - stopped:.1f} s after SIGSTOP, "
          f"stopped {resumed - stopped:.1f} s; steps reported after it was named: {reported}")
    assert len(reported) >= 2 and reported[-1] - reported[0] >= 5, (reported, chief.tail())
    assert chief.proc.poll() is None, chief.tail()  # still training: the fixture kills it
    assert not chief.of_kind("failure"), chief.tail()
