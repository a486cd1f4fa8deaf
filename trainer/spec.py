"""The trainer launch spec (Contract 1): one JSON file per run, read by every role.

The orchestrator builds a `TrainerSpec`, writes it with `to_json(path)` and starts each role
with `python -m trainer --role R --index I --spec PATH`. Field names are the contract; keep
them in step with docs/architecture.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer.layout import CLUSTER_JOBS, PROTOCOLS, ROLE_CHIEF, ROLE_PS, ROLE_WORKER, RunLayout

PHASE_HPARAMS = ("learning_rate", "momentum")  # what a phase may override in place
__all__ = ["CLUSTER_JOBS", "PROTOCOLS"]  # re-exported: the spec's allowed values


class Optimizer(StrEnum):
    """``job.optimizer``; str-valued, so the JSON spec holds the plain name."""

    sgd = "sgd"
    momentum = "momentum"
    adam = "adam"


class LrSchedule(StrEnum):
    """``job.lr_schedule``; str-valued, so the JSON spec holds the plain name."""

    constant = "constant"
    cosine = "cosine"
    step = "step"


@dataclass
class JobSpec:
    """What is trained and how; identical for every role of a run.

    Also the orchestrator's ``job`` config group schema (orchestrator/config/schema.py mounts
    it), so a field is declared once: the comments here are what the user reads.
    """

    model: str = "cnn"  # model registry name: resnet | cnn
    hparam_set: str = "cnn_small"  # e.g. resnet_cifar_32; must belong to the model
    problem: str = "digits"  # problem registry: digits | image_cifar10 | image_cifar100 | synthetic
    data_dir: str | None = None  # folder or gs://BUCKET/PREFIX with the files; None = the cache
    train_steps: int = 1000  # global steps (with phases: the budget in BSP-equivalent steps)
    batch_size: int = 64  # per worker and step
    optimizer: Optimizer = Optimizer.momentum
    learning_rate: float = 0.02
    momentum: float = 0.9  # for optimizer=momentum
    weight_decay: float = 0.0  # L2 factor on conv/dense kernels
    lr_schedule: LrSchedule = LrSchedule.constant
    lr_decay_steps: list[int] = field(default_factory=list)  # global steps, for lr_schedule=step
    lr_decay_factor: float = 0.1  # multiplier at each lr_decay_steps boundary
    warmup_steps: int = 0  # linear warm-up
    checkpoint_frequency: int = 0  # steps between checkpoints; 0 = only at the end
    keep_checkpoints: int = 3
    eval_frequency: int = 0  # steps between evaluations; 0 = only at the end
    seed: int = 0
    steps_per_closure: int = 0  # steps per worker closure (ASP, BSP); 0 = from the step time

    def __post_init__(self) -> None:
        # a spec read from JSON or built by hand names its choices as text: hold the member;
        # an unknown name stays as given, for validate() to name
        self.optimizer = _member(Optimizer, self.optimizer)
        self.lr_schedule = _member(LrSchedule, self.lr_schedule)

    def validate(self) -> None:
        """Raise AssertionError naming the field and the allowed values."""
        assert self.train_steps >= 1, f"job.train_steps: must be >= 1 (got {self.train_steps})"
        assert self.batch_size >= 1, f"job.batch_size: must be >= 1 (got {self.batch_size})"
        assert self.optimizer in tuple(Optimizer), (
            f"job.optimizer: unknown {self.optimizer!r} (one of {', '.join(Optimizer)})")
        assert self.lr_schedule in tuple(LrSchedule), (
            f"job.lr_schedule: unknown {self.lr_schedule!r} (one of {', '.join(LrSchedule)})")
        assert self.learning_rate > 0, (
            f"job.learning_rate: must be > 0 (got {self.learning_rate})")
        assert 0.0 <= self.momentum < 1.0, f"job.momentum: must be in [0, 1) (got {self.momentum})"
        assert self.weight_decay >= 0, f"job.weight_decay: must be >= 0 (got {self.weight_decay})"
        assert self.warmup_steps >= 0, f"job.warmup_steps: must be >= 0 (got {self.warmup_steps})"
        assert list(self.lr_decay_steps) == sorted(self.lr_decay_steps), (
            f"job.lr_decay_steps: must be increasing (got {self.lr_decay_steps})")
        assert self.lr_schedule != "step" or self.lr_decay_steps, (
            "job.lr_decay_steps: required for lr_schedule=step (e.g. [32000, 48000])")
        assert self.checkpoint_frequency >= 0, (
            f"job.checkpoint_frequency: must be >= 0 (got {self.checkpoint_frequency})")
        assert self.eval_frequency >= 0, (
            f"job.eval_frequency: must be >= 0 (got {self.eval_frequency})")
        assert self.steps_per_closure >= 0, (
            f"job.steps_per_closure: must be >= 0, 0 = automatic (got {self.steps_per_closure})")
        assert self.keep_checkpoints >= 1, (
            f"job.keep_checkpoints: must be >= 1 (got {self.keep_checkpoints})")


@dataclass
class PhaseSpec:
    """One synchronization phase; `end_step` is a cumulative global-step target."""

    protocol: str
    end_step: int
    hparams: dict[str, float] = field(default_factory=dict)

    def validate(self, where: str = "phases[?]") -> None:
        assert self.protocol in PROTOCOLS, (
            f"{where}.protocol: unknown {self.protocol!r} (one of {', '.join(PROTOCOLS)})")
        assert self.end_step >= 1, f"{where}.end_step: must be >= 1 (got {self.end_step})"
        for key in self.hparams:
            assert key in PHASE_HPARAMS, (
                f"{where}.hparams.{key}: cannot be changed in place (one of "
                f"{', '.join(PHASE_HPARAMS)})")


@dataclass
class StragglerSpec:
    """An injected slowdown: each step on the listed workers takes `delay_s` longer.

    The episode is active for worker w when w is in `workers` and either the time window
    (`start_s` <= t < `end_s`, t = seconds since the chief's train_start; `end_s` None = until
    the end) or the step window (`start_step` <= global step < `end_step`) holds. A window
    whose start is None is not used. The delay is added inside the step on the worker
    (trainer/steps.py), so it shows up in that worker's `worker_steps` timings.
    """

    workers: list[int]
    delay_s: float
    start_s: float | None = None
    end_s: float | None = None
    start_step: int | None = None
    end_step: int | None = None

    def validate(self, where: str = "stragglers[?]", num_workers: int | None = None) -> None:
        assert self.workers, f"{where}.workers: needs at least one worker index"
        for w in self.workers:
            assert w >= 0 and (num_workers is None or w < num_workers), (
                f"{where}.workers: index {w} out of range (cluster has {num_workers} workers)")
        assert self.delay_s > 0, f"{where}.delay_s: must be > 0 (got {self.delay_s})"
        assert self.start_s is not None or self.start_step is not None, (
            f"{where}: needs start_s or start_step (when the episode starts)")
        for lo, hi, name in ((self.start_s, self.end_s, "s"),
                             (self.start_step, self.end_step, "step")):
            assert hi is None or lo is not None, f"{where}.end_{name}: needs start_{name}"
            assert lo is None or lo >= 0, f"{where}.start_{name}: must be >= 0 (got {lo})"
            assert hi is None or hi > lo, (
                f"{where}.end_{name}: must be > start_{name} (got {hi} <= {lo})")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> StragglerSpec:
        _reject_unknown(cls, data, f"{where}.")

        def opt(key: str, kind: type) -> Any:
            return None if data.get(key) is None else kind(data[key])

        return cls(workers=[int(w) for w in data["workers"]], delay_s=float(data["delay_s"]),
                   start_s=opt("start_s", float), end_s=opt("end_s", float),
                   start_step=opt("start_step", int), end_step=opt("end_step", int))


@dataclass
class TrainerSpec:
    """Everything a trainer role needs; see docs/architecture.md, Contract 1."""

    run_id: str
    cluster: dict[str, list[str]]
    job: JobSpec
    phases: list[PhaseSpec]
    run_dir: str
    report_every_s: float = 1.0
    stragglers: list[StragglerSpec] = field(default_factory=list)  # injected slowdowns
    control_file: str | None = None  # orchestrator -> chief; None = <run_dir>/control.json
    checkpoint_dir: str | None = None  # the checkpoint store; None = <run_dir>/checkpoints
    #: tasks (job -> indices) whose host has an accelerator the backend provides: their server
    #: fails at start when TensorFlow sees no GPU there, instead of training on the CPU
    gpu_tasks: dict[str, list[int]] = field(default_factory=dict)

    @property
    def layout(self) -> RunLayout:
        """Where this role's files are on its host (trainer/layout.py)."""
        return RunLayout(self.run_dir, self.checkpoint_dir)

    @property
    def control_path(self) -> Path:
        """The control file the chief polls (see trainer/control.py for its format)."""
        return Path(self.control_file or self.layout.control)

    def validate(self) -> None:
        """Check the whole spec; AssertionError messages name the field and the fix."""
        assert self.run_id, "run_id: must not be empty"
        for job_name in self.cluster:
            assert job_name in CLUSTER_JOBS, (
                f"cluster.{job_name}: unknown job (one of {', '.join(CLUSTER_JOBS)})")
        assert self.cluster.get(ROLE_PS), "cluster.ps: needs at least one host:port"
        assert self.cluster.get(ROLE_WORKER), "cluster.worker: needs at least one host:port"
        assert len(self.cluster.get(ROLE_CHIEF, [])) == 1, (
            f"cluster.chief: needs exactly one host:port (got {self.cluster.get(ROLE_CHIEF)})")
        for job_name, addresses in self.cluster.items():
            for i, address in enumerate(addresses):
                host, _, port = address.rpartition(":")
                assert host and port.isdigit(), (
                    f"cluster.{job_name}[{i}]: expected host:port (got {address!r})")
        for job_name, indices in self.gpu_tasks.items():
            count = len(self.cluster.get(job_name, []))
            assert all(0 <= i < count for i in indices), (
                f"gpu_tasks.{job_name}: indices must be within cluster.{job_name} "
                f"({count} tasks, got {indices})")
        self.job.validate()
        assert self.phases, "phases: needs at least one phase"
        previous = 0
        for i, phase in enumerate(self.phases):
            phase.validate(f"phases[{i}]")
            assert phase.end_step > previous, (
                f"phases[{i}].end_step: targets are cumulative and must increase "
                f"(got {phase.end_step} after {previous})")
            if "momentum" in phase.hparams:
                assert self.job.optimizer == "momentum", (
                    f"phases[{i}].hparams.momentum: needs job.optimizer=momentum "
                    f"(got {self.job.optimizer})")
            previous = phase.end_step
        assert previous == self.job.train_steps, (
            f"phases[-1].end_step: must equal job.train_steps ({previous} != "
            f"{self.job.train_steps})")
        assert self.report_every_s > 0, (
            f"report_every_s: must be > 0 (got {self.report_every_s})")
        assert self.run_dir, "run_dir: must not be empty"
        for i, straggler in enumerate(self.stragglers):
            straggler.validate(f"stragglers[{i}]", len(self.cluster[ROLE_WORKER]))

    @property
    def num_workers(self) -> int:
        return len(self.cluster[ROLE_WORKER])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerSpec:
        """Build and validate; unknown keys raise ValueError naming them."""
        _reject_unknown(cls, data, "")
        _reject_unknown(JobSpec, data["job"], "job.")
        phases = []
        for i, phase in enumerate(data["phases"]):
            _reject_unknown(PhaseSpec, phase, f"phases[{i}].")
            phases.append(PhaseSpec(protocol=phase["protocol"], end_step=int(phase["end_step"]),
                                    hparams={k: float(v) for k, v in
                                             phase.get("hparams", {}).items()}))
        job = dict(data["job"])
        job["lr_decay_steps"] = [int(s) for s in job.get("lr_decay_steps", [])]
        spec = cls(
            run_id=str(data["run_id"]),
            cluster={k: list(v) for k, v in data["cluster"].items()},
            job=JobSpec(**job),
            phases=phases,
            run_dir=str(data["run_dir"]),
            report_every_s=float(data.get("report_every_s", 1.0)),
            stragglers=[StragglerSpec.from_dict(s, f"stragglers[{i}]")
                        for i, s in enumerate(data.get("stragglers", []))],
            control_file=None if data.get("control_file") is None else str(data["control_file"]),
            checkpoint_dir=(None if data.get("checkpoint_dir") is None
                            else str(data["checkpoint_dir"])),
            gpu_tasks={k: [int(i) for i in v] for k, v in data.get("gpu_tasks", {}).items()},
        )
        spec.validate()
        return spec

    def to_json(self, path: str | Path) -> Path:
        """Validate, then write the spec as indented JSON; returns the path."""
        self.validate()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> TrainerSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _member(kind: type[StrEnum], value: Any) -> Any:
    """``value`` as a member of ``kind`` when it names one, else unchanged."""
    try:
        return kind(value)
    except ValueError:
        return value


def _reject_unknown(cls: type, data: dict[str, Any], prefix: str) -> None:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{prefix}{unknown[0]}: unknown field in trainer spec "
                         f"(one of {', '.join(sorted(known))})")
