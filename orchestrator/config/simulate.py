"""Config schemas of the simulator, the planner and the quota queue (top-level ``sim``,
``planner`` and ``queue`` keys of :class:`orchestrator.config.schema.ExperimentConfig`).

Kept in ``config/`` with the other schemas (data only: the config room never imports the
simulation that reads them); ``schema.py`` mounts them. Every default is a
choice of the user interface (how many repeats, which objective), not a model figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class LifetimeData(StrEnum):
    """Which measured lifetimes the simulated cloud revokes by."""

    cmdare = "cmdare"  # CM-DARE (ICDCS'20), 396 VMs: the default
    icac19 = "icac19"  # ICAC'19, February 2019: the period of ICAC'19's training runs


class QueuePolicy(StrEnum):
    """Order in which a sweep's runs get GPUs under a quota."""

    fifo = "fifo"  # in sweep order
    spf = "spf"  # shortest predicted first (the plan's predicted GPU-hours)
    las = "las"  # Tiresias' discretized 2D least-attained-service (GPUs × time received)
    gittins = "gittins"  # Tiresias' discretized 2D-Gittins index (needs a length distribution)


class Objective(StrEnum):
    """What the planner ranks by (among configurations that meet the constraints)."""

    cost = "cost"  # cheapest expected cost
    time = "time"  # fastest expected time
    deadline = "deadline"  # highest P(finish before planner.deadline_h), then cost


class PlannerZones(StrEnum):
    """Which zones the planner tries for a GPU."""

    region = "region"  # one zone per region offering the GPU (transient only)
    first = "first"  # the first zone offering it


@dataclass
class SimConfig:
    """``provider=sim``: how the simulated cloud behaves and how often to draw it. Its market
    (preemptible with the 24 h cap, or Spot) is not set here: it follows the cloud that would
    run it (:func:`orchestrator.simulate.cloud.cloud_market`)."""

    seed: int = 0  # seeds every draw of a simulated run (start-up, lifetimes, delays)
    repeats: int = 20  # simulations per configuration for the dry run's band (planner: its own)
    lifetimes: LifetimeData = LifetimeData.cmdare  # measured lifetimes to revoke by
    lifetime_region: str | None = None  # null = each host's region; "all" = pooled regions
    speed_error: bool = True  # each run draws the speed model's held-out error per GPU type;
    #   false = the point estimate (the comparison with the papers' means uses it)


@dataclass
class PlannerConfig:
    """``python -m orchestrator.plan``: the search space and the objective."""

    deadline_h: float | None = None  # hours; P(finish before it) is reported; null = none
    budget_usd: float | None = None  # configurations whose mean cost exceeds it are dropped
    objective: Objective = Objective.cost  # cost | time | deadline
    gpus: list[str] = field(default_factory=list)  # catalog GPUs to try; [] = all with a model
    workers: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # worker counts
    parameter_servers: list[int] = field(default_factory=list)  # PS counts to try; [] = the
    #   experiment's cluster.parameter_servers and, when nothing meets the limits with it, one
    #   more for the clusters whose ASP workers could outrun it (their 2σ-fast step rate above
    #   what those PS serve)
    transient: list[bool] = field(default_factory=lambda: [True, False])  # pricing to try
    zones: PlannerZones = PlannerZones.region  # region | first
    bsp_fractions: list[float] = field(default_factory=list)  # [] = the experiment's sync; else
    #   one Sync-Switch schedule per value (0 = ASP, 1 = BSP), job.train_steps = BSP budget
    top: int = 15  # rows printed
    min_p_deadline: float = 0.9  # with a deadline: drop configurations less likely to meet it
    repeats: int = 200  # simulations per configuration at first (sim.repeats: the dry run's)
    max_repeats: int = 1600  # ... doubled up to this while P(deadline) is not known to:
    p_precision: float = 0.025  # half-width of its 95 % interval (docs/simulation.md: the
    #   printed P is within ±5 points of the share over 1,000 fresh runs)


@dataclass
class QueueConfig:
    """Runs of a sweep sharing a GPU quota: the simulated sweep (orchestrator/simulate/sweep.py)
    and the concurrent launcher of real sweeps (``hydra/launcher=parallel``,
    orchestrator/parallel.py). One value per sweep: every point must agree."""

    policy: QueuePolicy = QueuePolicy.spf  # fifo | spf | las | gittins; spf was best
    #   (docs/simulation.md); las and gittins preempt: a real sweep's point checkpoints,
    #   releases its hosts and is resumed later (orchestrator/parallel.py)
    quota_gpus: int | None = None  # GPUs the project may hold at once; null = no quota
    max_concurrent: int = 4  # parallel launcher: runs live at once (quota permitting)
    run_gpus: int | None = None  # GPUs one run holds against the quota; null = its plan's
    #   (one per machine with a GPU, so CPU-only local runs hold 0)
    las_threshold_gpu_h: float = 1.0  # las, gittins: GPU-hours after which a run drops a
    #   queue (then one queue per doubling); a real sweep counts GPUs × wall time live
    compare: bool = True  # also report every other policy on the same sweep
