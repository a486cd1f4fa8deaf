"""``-m hydra/launcher=parallel``: a sweep's points as concurrent runs, under a GPU quota.

Hydra finds this module by scanning the ``hydra_plugins`` namespace package (in the checkout
and in the installed wheel alike) and imports it at every start, so it imports nothing heavy:
the work is done by :mod:`orchestrator.parallel`. Its settings are the sweep's ``queue.*``
keys (``queue.max_concurrent``, ``queue.quota_gpus``, ``queue.policy``, ``queue.run_gpus``,
``queue.las_threshold_gpu_h``: ``las`` and ``gittins`` preempt points),
schema-checked and range-checked with the rest of the experiment.
"""

# No `from __future__ import annotations`: Hydra's scanner runs this module before it is in
# sys.modules, where dataclasses would look string annotations up.
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@dataclass
class ParallelLauncherConf:
    """No options of its own: the sweep's ``queue`` settings drive it (README "Sweeps in
    parallel / under a GPU quota")."""

    _target_: str = "hydra_plugins.transient_launcher.parallel.ParallelLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="parallel",
                             node=ParallelLauncherConf, provider="transient-orchestrator")


class ParallelLauncher(Launcher):
    """Every sweep point in its own process, at once as far as the queue settings allow."""

    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator import parallel
        from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE

        assert self.config is not None and self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        points, queue = parallel.prepare(self.config, self.hydra_context.config_loader,
                                         job_overrides, initial_job_idx)
        if all(p.dry_run for p in points):  # plans only: printed one after another, in-process
            from hydra._internal.core_plugins.basic_launcher import BasicLauncher

            basic = BasicLauncher()
            basic.setup(hydra_context=self.hydra_context, task_function=self.task_function,
                        config=self.config)
            return basic.launch(job_overrides, initial_job_idx)
        codes = parallel.launch(points, queue, self.hydra_context, self.task_function,
                                sweep_dir)
        if any(code == CONFIG_ERROR_EXIT_CODE for code in codes):  # only a run could find it
            raise SystemExit(CONFIG_ERROR_EXIT_CODE)
        return [_job_return(point, code) for point, code in zip(points, codes, strict=True)]


def _job_return(point: Any, code: int | None) -> JobReturn:
    """What Hydra's sweeper expects back. A failed run is not an exception here: the run
    recorded why, and the entry point exits 1 for it (orchestrator.sweep.failed_runs)."""
    from orchestrator.rundir import results

    ret = JobReturn(overrides=list(point.overrides), cfg=point.config,
                    hydra_cfg=point.config, working_dir=str(point.run_dir),
                    task_name=str(point.config.hydra.job.name))
    ret.status = JobStatus.COMPLETED
    ret.return_value = results.read_summary(point.run_dir) if code is not None else None
    return ret
