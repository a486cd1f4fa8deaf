"""Large simulated sweeps in seconds: Hydra's sweep syntax, batched in one process or parallel.

``python -m orchestrator -m ... provider=sim`` works for any sweep, but Hydra composes every
point from the YAML files (≈ 1–2 s each on a busy 2-core machine), which is far more than the
simulation itself (≈ 15 ms). Here the sweep is expanded with Hydra's own parser and cross
product (:func:`orchestrator.sweep.expand_sweep`), each distinct choice of config *groups* is
composed once, and the value overrides are applied to a copy of the validated dataclasses::

    python -m orchestrator.simulate.sweep +experiment=icac19_k80 \
        cluster.workers=1,2,4,8,16 sim.seed='range(0,200)' [--processes 2] [--out DIR]

Every point is validated before the first runs (as :class:`orchestrator.sweep.SweepValidator`
does); each writes a run directory of the real schema and a row of the sweep's ``runs.csv``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import json
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from orchestrator import sweep as hydra_sweep
from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.simulate import QueueConfig
from orchestrator.rundir import index
from orchestrator.simulate.queue import QueuedRun, Schedule, compare, markdown, predict_time_s

#: Config groups: an override of one of these selects a YAML file, so it needs a compose.
GROUPS = ("cluster", "job", "sync", "provider", "pricing", "revocation", "straggler",
          "experiment")

_parser = OverridesParser.create()
_composed: dict[tuple[str, ...], ExperimentConfig] = {}


def _is_group(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return "." not in key and key in GROUPS


def _needs_compose(value: Any) -> bool:
    """Values holding mappings (``[{target: worker-1, at_s: 60}]``) become nested dataclasses:
    only OmegaConf's merge builds those."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(isinstance(v, dict | list) for v in value)


def split(point: Sequence[str]) -> tuple[tuple[str, ...], list[tuple[str, Any]]]:
    """A sweep point's overrides → (overrides that need a compose, [(dotted key, value)])."""
    composed, values = [], []
    for item in point:
        if _is_group(item):
            composed.append(item)
            continue
        override = _parser.parse_overrides([item])[0]
        value = override.value()
        if _needs_compose(value):
            composed.append(item)
        else:
            values.append((override.key_or_group, value))
    return tuple(composed), values


def base_config(composed: tuple[str, ...]) -> ExperimentConfig:
    """The validated dataclasses for one choice of groups (composed once per process)."""
    if composed not in _composed:
        from orchestrator.simulate.validate import compose

        _composed[composed] = compose(list(composed))
    return _composed[composed]


def apply(cfg: ExperimentConfig, values: list[tuple[str, Any]]) -> ExperimentConfig:
    """A copy of ``cfg`` with ``key=value`` overrides set, converted to the field's type.

    Raises ConfigError naming the key for an unknown field (as the composed path would)."""
    touched = {key.split(".", 1)[0] for key, _ in values}
    shared = {id(getattr(cfg, f.name)): getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if f.name not in touched}  # untouched sections (the catalog) are not copied
    out = copy.deepcopy(cfg, shared)
    for key, value in values:
        parts = key.split(".")
        node: Any = out
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else getattr(node, part, None)
            if node is None:
                raise ConfigError(key, f"unknown key '{part}'")
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = value
            continue
        if not dataclasses.is_dataclass(node) or last not in {f.name for f in
                                                               dataclasses.fields(node)}:
            raise ConfigError(key, f"unknown key '{last}'")
        current = getattr(node, last)
        if isinstance(current, enum.Enum) and value is not None:
            try:
                value = type(current)(value)
            except ValueError:
                allowed = ", ".join(m.value for m in type(current))
                raise ConfigError(key, f"'{value}' is not valid", f"one of: {allowed}") from None
        elif isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        setattr(node, last, value)
    return out


def prepare(points: list[list[str]]) -> list[tuple[list[str], ExperimentConfig]]:
    """Every point as validated dataclasses (exits 2 with the one-line error, as a sweep does)."""
    from orchestrator.config.validation import validate

    out = []
    for point in points:
        try:
            composed, values = split(point)
            cfg = apply(base_config(composed), values)
            validate(cfg)
        except ConfigError as err:
            print(err.line() + f" [sweep point: {' '.join(point)}]", file=sys.stderr)
            raise SystemExit(CONFIG_ERROR_EXIT_CODE) from None
        out.append((point, cfg))
    return out


def _run_points(job: tuple[list[tuple[int, list[str]]], list[str], str]) -> list[QueuedRun]:
    """Simulate and record points ``[(job number, overrides)]`` (one process's share); each
    run as the quota queue sees it (GPUs, simulated and predicted duration)."""
    from orchestrator.plan import make_plan
    from orchestrator.simulate.models import NoModelError, SimModels
    from orchestrator.simulate.run import execute_sim

    numbered, base, out = job
    sweep_dir = Path(out)
    models = SimModels.load()
    queued = []
    for (num, point), (_, cfg) in zip(numbered, prepare([base + p for _, p in numbered]),
                                      strict=True):
        cfg.provider.name = "sim"
        run_dir = sweep_dir / str(num)
        plan = make_plan(cfg)
        summary = execute_sim(cfg, plan, run_dir, dataclasses.asdict(cfg))
        index.append_run_row(sweep_dir / index.RUNS_CSV, point, run_dir, summary)
        try:
            predicted = predict_time_s(cfg, plan, models)
        except NoModelError:
            continue
        gpus = plan.gpus if cfg.queue.run_gpus is None else cfg.queue.run_gpus
        queued.append(QueuedRun(str(num), gpus, summary["wall_time_s"], predicted))
    return queued


def run_sweep(base: list[str], sweep: list[str], out: Path, processes: int = 1
              ) -> list[QueuedRun]:
    """Expand ``sweep`` (Hydra syntax) under ``base`` and simulate every point; returns the
    runs (for the quota queue). ``processes`` > 1 splits the points over worker processes."""
    points = hydra_sweep.expand_sweep(sweep) if sweep else [[]]
    prepare([base + p for p in points[:1]])  # fail fast on the first point's config
    out.mkdir(parents=True, exist_ok=True)
    numbered = list(enumerate(points))
    if processes <= 1:
        return _run_points((numbered, base, str(out)))
    shares = [(numbered[i::processes], base, str(out)) for i in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return sorted((r for part in pool.map(_run_points, shares) for r in part),
                      key=lambda r: int(r.name))


def main(argv: list[str] | None = None) -> int:
    from orchestrator.version import add_version_argument, prog_name

    parser = argparse.ArgumentParser(prog=prog_name("orchestrator.simulate.sweep"),
                                     description=__doc__.splitlines()[0])
    add_version_argument(parser, "orchestrator.simulate.sweep")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides; a,b,c sweeps")
    parser.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--out", type=Path, default=None,
                        help="sweep directory (default multirun/<name>/<time>-sim)")
    args = parser.parse_args(argv)
    base = [o for o in args.overrides if _is_group(o) and "," not in o.split("=", 1)[1]
            and not o.startswith("provider=")] + ["provider=sim"]
    swept = [o for o in args.overrides if o not in base and not o.startswith("provider=")]
    name = base_config(tuple(b for b in base if _is_group(b))).name
    out = args.out or Path("multirun") / name / time.strftime("%Y-%m-%d_%H-%M-%S-sim")
    started = time.perf_counter()
    runs = run_sweep(base, swept, out, args.processes)
    print(f"{len(runs)} simulated runs in {time.perf_counter() - started:.1f} s; "
          f"results in {out} ({index.RUNS_CSV})")
    first = prepare([base + (hydra_sweep.expand_sweep(swept)[0] if swept else [])])[0][1]
    if first.queue.quota_gpus is not None and runs:
        report_queue(runs, first.queue, first.job.hparam_set, out)
    return 0


def report_queue(runs: list[QueuedRun], queue: QueueConfig, hparam_set: str, out: Path
                 ) -> list[Schedule]:
    """Schedule the simulated sweep under the quota with every policy; print and write
    ``queue.json``: the configured policy, and (``queue.compare``, the default) every other
    policy on the same sweep."""
    from orchestrator.simulate.models import SimModels

    models = SimModels.load()
    overhead = (models.checkpoint_s(hparam_set)  # a preempted run checkpoints, then restarts
                + models.params["startup"]["tf_start"]["warm"]["mean_s"])
    schedules = compare(runs, queue.quota_gpus or 0, queue.las_threshold_gpu_h, overhead)
    if not queue.compare:
        schedules = [s for s in schedules if s.policy == str(queue.policy)]
    demand = sum(r.gpus for r in runs)
    print("\n".join(markdown(schedules, queue.quota_gpus or 0, demand)))
    chosen = next(s for s in schedules if s.policy == str(queue.policy))
    print(f"queue.policy={queue.policy}: average completion {chosen.average_s / 3600:.2f} h"
          + (f"; best: {schedules[0].policy}" if queue.compare else ""))
    (out / "queue.json").write_text(json.dumps({
        "quota_gpus": queue.quota_gpus, "demand_gpus": demand, "policy": str(queue.policy),
        "restart_overhead_s": round(overhead, 3),
        "schedules": [s.to_dict() for s in schedules]}, indent=1) + "\n")
    return schedules


if __name__ == "__main__":
    raise SystemExit(main())
