"""Contract 1: the launch spec round-trips and rejects bad values with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.spec import (
    JobSpec,
    LrSchedule,
    Optimizer,
    PhaseSpec,
    StragglerSpec,
    TrainerSpec,
)

CLUSTER = {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"],
           "chief": ["127.0.0.1:2225"]}


def make(**changes: object) -> TrainerSpec:
    spec = TrainerSpec(run_id="r1", cluster=dict(CLUSTER), job=JobSpec(train_steps=100),
                       phases=[PhaseSpec("bsp", 25), PhaseSpec("asp", 100,
                                                               {"learning_rate": 0.1})],
                       run_dir="/tmp/r1")
    for key, value in changes.items():
        setattr(spec, key, value)
    return spec


def test_defaults_match_the_contract() -> None:
    job = JobSpec()
    assert (job.model, job.hparam_set, job.problem, job.data_dir) == ("cnn", "cnn_small",
                                                                      "digits", None)
    assert (job.train_steps, job.batch_size, job.optimizer) == (1000, 64, "momentum")
    assert (job.learning_rate, job.momentum, job.weight_decay) == (0.02, 0.9, 0.0)
    assert (job.lr_schedule, job.lr_decay_steps, job.lr_decay_factor) == ("constant", [], 0.1)
    assert (job.warmup_steps, job.checkpoint_frequency, job.keep_checkpoints) == (0, 0, 3)
    assert (job.eval_frequency, job.seed) == (0, 0)
    assert make().report_every_s == 1.0
    assert PhaseSpec("asp", 5).hparams == {}


def test_json_round_trip(tmp_path: Path) -> None:
    spec = make()
    path = spec.to_json(tmp_path / "sub" / "trainer_spec.json")
    assert TrainerSpec.from_json(path) == spec
    assert TrainerSpec.from_dict(spec.to_dict()) == spec
    data = json.loads(path.read_text())
    assert set(data) == {"run_id", "cluster", "job", "phases", "run_dir", "report_every_s",
                         "stragglers", "control_file", "checkpoint_dir", "gpu_tasks"}
    assert data["phases"][1] == {"protocol": "asp", "end_step": 100,
                                 "hparams": {"learning_rate": 0.1}}
    # the job's choices are str-valued enums: plain names in the file, members when read back
    assert '"optimizer": "momentum"' in path.read_text()
    assert (data["job"]["optimizer"], data["job"]["lr_schedule"]) == ("momentum", "constant")
    read = TrainerSpec.from_json(path).job
    assert (read.optimizer, read.lr_schedule) == (Optimizer.momentum, LrSchedule.constant)
    assert type(read.optimizer) is Optimizer and type(read.lr_schedule) is LrSchedule


@pytest.mark.parametrize(("changes", "message"), [
    ({"phases": [PhaseSpec("ssp", 100)]}, "phases[0].protocol: unknown 'ssp' (one of bsp, asp)"),
    ({"phases": [PhaseSpec("bsp", 50)]}, "phases[-1].end_step: must equal job.train_steps"),
    ({"phases": [PhaseSpec("bsp", 60), PhaseSpec("asp", 50), PhaseSpec("asp", 100)]},
     "phases[1].end_step: targets are cumulative and must increase"),
    ({"phases": [PhaseSpec("asp", 100, {"batch_size": 3})]},
     "phases[0].hparams.batch_size: cannot be changed in place"),
    ({"job": JobSpec(train_steps=100, optimizer="rmsprop")}, "job.optimizer: unknown 'rmsprop'"),
    ({"job": JobSpec(train_steps=100, lr_schedule="step")}, "job.lr_decay_steps: required"),
    ({"job": JobSpec(train_steps=0)}, "job.train_steps: must be >= 1 (got 0)"),
    ({"cluster": {"ps": [], "worker": ["a:1"], "chief": ["b:2"]}}, "cluster.ps: needs"),
    ({"cluster": {**CLUSTER, "chief": []}}, "cluster.chief: needs exactly one"),
    ({"cluster": {**CLUSTER, "worker": ["nohost"]}}, "cluster.worker[0]: expected host:port"),
    ({"cluster": {**CLUSTER, "evaluator": ["a:1"]}}, "cluster.evaluator: unknown job"),
])
def test_invalid_specs_name_the_field(changes: dict, message: str) -> None:
    with pytest.raises(AssertionError, match=_literal(message)):
        make(**changes).validate()


def test_momentum_override_needs_momentum_optimizer() -> None:
    spec = make(job=JobSpec(train_steps=100, optimizer="adam"),
                phases=[PhaseSpec("asp", 100, {"momentum": 0.5})])
    with pytest.raises(AssertionError, match=_literal("phases[0].hparams.momentum: needs")):
        spec.validate()


def test_unknown_json_key_is_rejected() -> None:
    data = make().to_dict()
    data["job"]["learning_rat"] = 0.1
    with pytest.raises(ValueError, match=r"job\.learning_rat: unknown field"):
        TrainerSpec.from_dict(data)


def _literal(text: str) -> str:
    import re
    return re.escape(text)


def test_transient_fields_round_trip(tmp_path: Path) -> None:
    spec = make(stragglers=[StragglerSpec(workers=[1], delay_s=0.15, start_s=5.0, end_s=30.0),
                            StragglerSpec(workers=[0, 1], delay_s=0.1, start_step=40)],
                control_file=str(tmp_path / "ctl.json"))
    back = TrainerSpec.from_json(spec.to_json(tmp_path / "trainer_spec.json"))
    assert back == spec and back.control_path == tmp_path / "ctl.json"
    assert back.stragglers[1].end_step is None and back.stragglers[1].start_s is None
    assert make().stragglers == [] and make().control_path == Path("/tmp/r1/control.json")
    old = make().to_dict()
    del old["stragglers"], old["control_file"]  # a spec written before these fields
    assert TrainerSpec.from_dict(old) == make()


@pytest.mark.parametrize(("straggler", "message"), [
    (StragglerSpec(workers=[2], delay_s=0.1, start_s=0.0), "stragglers[0].workers: index 2"),
    (StragglerSpec(workers=[0], delay_s=0.0, start_s=0.0), "stragglers[0].delay_s: must be > 0"),
    (StragglerSpec(workers=[0], delay_s=0.1), "stragglers[0]: needs start_s or start_step"),
    (StragglerSpec(workers=[0], delay_s=0.1, start_s=5.0, end_s=5.0),
     "stragglers[0].end_s: must be > start_s"),
    (StragglerSpec(workers=[0], delay_s=0.1, start_s=1.0, end_step=9),
     "stragglers[0].end_step: needs start_step"),
])
def test_invalid_stragglers_name_the_field(straggler: StragglerSpec, message: str) -> None:
    with pytest.raises(AssertionError, match=_literal(message)):
        make(stragglers=[straggler]).validate()


def test_unknown_straggler_key_is_rejected() -> None:
    data = make().to_dict()
    data["stragglers"] = [{"workers": [0], "delay_s": 0.1, "start_s": 0, "delay": 1}]
    with pytest.raises(ValueError, match=r"stragglers\[0\]\.delay: unknown field"):
        TrainerSpec.from_dict(data)
