"""Structured-config schemas for transient servers: revocations, recovery, stragglers, policies.

Same conventions as :mod:`orchestrator.config.schema`: required fields are ``MISSING``, choices are
enums, every field's comment gives its unit. :func:`register_transient_configs` stores them as
``<group>/base_<group>`` so ``conf/revocation/*.yaml`` and ``conf/straggler/*.yaml`` can name
their schema first in their defaults list. The lead wires them into ``ExperimentConfig``.

Time conventions used by every consumer (see :mod:`orchestrator.transient.revocation`):
``*_s`` fields are seconds of *run time*, counted from the chief's ``train_start`` event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from orchestrator.config.errors import ConfigError
from orchestrator.config.ranges import check_ranges

#: GCE's preemption notice (seconds between the notice and the stop).
GCE_NOTICE_S = 30.0
#: Local default replacement delay; the papers measured 66-78 s on GCE (research.md).
LOCAL_REPLACEMENT_DELAY_S = 5.0


class RevocationModel(StrEnum):
    """How revocation times are produced."""

    none = "none"  # nothing is revoked
    schedule = "schedule"  # explicit events: at a run time or a global step, which server
    exponential = "exponential"  # memoryless: rate_per_hour per eligible server
    trace = "trace"  # lifetimes resampled from the papers' measured GCE lifetimes


class TraceSampling(StrEnum):
    """How a fitted model file (``revocation.model_file``) is sampled."""

    empirical = "empirical"  # inverse of the Kaplan-Meier CDF, uniform within an hour bin
    weibull = "weibull"  # the fitted Weibull (captures first-hour infant mortality)
    exponential = "exponential"  # the fitted constant hazard


class OnRevocation(StrEnum):
    """What happens when a worker is revoked (PS/chief loss always restarts from a checkpoint)."""

    shrink = "shrink"  # continue with the remaining workers (ICAC'19)
    replace = "replace"  # acquire a replacement that joins the running job (CM-DARE)


class SyncPolicyName(StrEnum):
    """Online synchronisation policy that may override the phase schedule's protocol."""

    none = "none"  # follow the phase schedule only
    straggler_switch = "straggler_switch"  # Sync-Switch: ASP while a straggler persists


@dataclass
class RevocationEventConfig:
    """One scheduled revocation. Exactly one of ``at_s`` / ``at_step`` is set."""

    target: str = MISSING  # host name (worker-1, ps-0, chief-0) or a role (worker = any eligible)
    at_s: float | None = None  # run seconds (since train_start) when the revocation begins
    at_step: int | None = None  # global step at which the revocation begins


@dataclass
class RevocationConfig:
    """Which servers are revoked, and when. Seeded: the same seed gives the same plan."""

    name: str = MISSING  # label shown in the plan
    model: RevocationModel = RevocationModel.none
    seed: int = 0  # seeds every draw; CLI: revocation.seed=7
    events: list[RevocationEventConfig] = field(default_factory=list)  # model=schedule
    rate_per_hour: float = 0.0  # model=exponential: revocations per server-hour (cloud clock)
    gpu: str | None = None  # model=trace: GPU whose lifetimes to use; None = each host's GPU
    region: str | None = None  # model=trace: region (or zone); None = from each host's zone
    model_file: str | None = None  # model=trace: fitted-model JSON/YAML from analysis; None = CSV
    sampling: TraceSampling = TraceSampling.empirical  # model=trace with model_file
    time_scale: float = 1.0  # 1 run second stands for time_scale cloud seconds (exponential, trace)
    notice_s: float = 0.0  # seconds of preemption notice before the kill; 0 = none, GCE gives 30
    include_ps: bool = False  # also revoke parameter servers even if not marked transient
    include_chief: bool = False  # also revoke the chief even if not marked transient


@dataclass
class RecoveryConfig:
    """How the run recovers from a lost server (lives under ``cluster``)."""

    on_revocation: OnRevocation = OnRevocation.shrink  # worker loss: shrink | replace
    replacement_delay_s: float = LOCAL_REPLACEMENT_DELAY_S  # request to ready; GCE: 66-78 s
    max_restarts: int = 2  # PS/chief losses survived by a restart from checkpoint; then failed
    restart_delay_s: float = 0.0  # extra pause before each restart from checkpoint (backoff)
    # a training chief that sends no event at all this long is hung (SIGSTOP, a stuck loop):
    # killed and restarted from checkpoint; None = max(300 s, 30 × report_every_s + the
    # provider's contact grace: a machine out of contact is the provider's to judge)
    chief_silence_s: float | None = None


@dataclass
class StragglerInjection:
    """Added per-step delay on some workers, in one or more episodes."""

    workers: list[int] = MISSING  # worker task indices, e.g. [1]
    delay_s: float = MISSING  # seconds added to each step of those workers
    start_s: float | None = None  # run seconds when the first episode starts
    start_step: int | None = None  # or: global step when the first episode starts
    duration_s: float | None = None  # seconds per episode; None = until the end of the run
    every_s: float = 0.0  # seconds between episode starts; 0 = one episode
    repeats: int = 1  # number of episodes when every_s > 0


@dataclass
class StragglerDetection:
    """A worker straggles when its step time exceeds k × its peers' median m times in a row."""

    k: float = 1.5  # threshold factor on the peers' median step time
    m: int = 3  # consecutive slow (to start) or normal (to end) steps


@dataclass
class StragglerConfig:
    """Straggler injection (what to slow down) and detection (what counts as slow)."""

    name: str = MISSING  # label shown in the plan
    enabled: bool = False  # false: no injection (detection still runs for the policy)
    injections: list[StragglerInjection] = field(default_factory=list)
    detection: StragglerDetection = field(default_factory=StragglerDetection)


@dataclass
class SyncPolicyConfig:
    """An online policy that may override the phase schedule's protocol while training."""

    policy: SyncPolicyName = SyncPolicyName.none
    min_dwell_s: float = 10.0  # at least this long between two switches (no flapping)
    calm_s: float = 5.0  # straggler-free seconds before switching back to BSP
    switch_back: bool = True  # false: switch to ASP once and stay (Sync-Switch policy 2)


def register_transient_configs() -> None:
    """Store the schemas as ``base_*`` in their groups. Idempotent (re-storing replaces)."""
    cs = ConfigStore.instance()
    cs.store(group="revocation", name="base_revocation", node=RevocationConfig)
    cs.store(group="straggler", name="base_straggler", node=StragglerConfig)


# --- semantic checks (the lead calls these from orchestrator.config.validation) -------------------------


def validate_revocation(cfg: RevocationConfig, path: str = "revocation") -> None:
    """Check meaning, not shape; raises ConfigError naming the field. Host names are checked
    against the cluster later, by :func:`orchestrator.transient.revocation.plan_revocations`."""
    check_ranges(cfg, path)
    if cfg.model == RevocationModel.exponential and cfg.rate_per_hour <= 0:
        raise ConfigError(f"{path}.rate_per_hour", f"must be > 0 (got {cfg.rate_per_hour:g})")
    if cfg.model == RevocationModel.schedule and not cfg.events:
        raise ConfigError(f"{path}.events", "model=schedule needs at least one event")
    for i, event in enumerate(cfg.events):
        if (event.at_s is None) == (event.at_step is None):
            raise ConfigError(f"{path}.events.{i}", "set exactly one of at_s and at_step")


def validate_recovery(cfg: RecoveryConfig, path: str = "cluster.recovery") -> None:
    """Delays are non-negative and restarts bounded; raises ConfigError naming the field."""
    check_ranges(cfg, path)


def validate_straggler(cfg: StragglerConfig, path: str = "straggler") -> None:
    """Injections are well-formed and detection thresholds meaningful; raises ConfigError."""
    check_ranges(cfg, path)
    for i, inj in enumerate(cfg.injections):
        p = f"{path}.injections.{i}"
        if not inj.workers:
            raise ConfigError(f"{p}.workers", "must list at least one worker index")
        if (inj.start_s is None) == (inj.start_step is None):
            raise ConfigError(p, "set exactly one of start_s and start_step")
        if inj.start_step is not None and (inj.duration_s is not None or inj.every_s > 0):
            # the trainer anchors step-started episodes at a global step it sees, not at a
            # run second, so only an open-ended one is exact there
            raise ConfigError(p, "a step-started injection lasts to the end of the run",
                              "set duration_s: null and every_s: 0, or use start_s")
        if inj.every_s > 0 and inj.duration_s is not None and inj.duration_s > inj.every_s:
            raise ConfigError(f"{p}.duration_s", "episodes overlap (duration_s > every_s)")


def validate_sync_policy(cfg: SyncPolicyConfig, path: str = "sync.policy") -> None:
    """Hysteresis times are non-negative; raises ConfigError naming the field."""
    check_ranges(cfg, path)
