"""The fitted models, as the simulator uses them (read from the exported ``sim_models.json``).

Every figure comes from :data:`orchestrator.simulate.fit.PARAMS_FILE`, which
``python -m orchestrator.simulate.fit`` exports from ``analysis/``: no number here is typed in.
Pure functions of the parameters; draws take a ``random.Random`` so runs are seeded.

Time of one training step (seconds, the cluster's global step):

* one worker: the speed model's step time for (hparam_set, GPU) at batch 128, scaled linearly
  with the batch (``t·b/128``, the convention of the plan), plus any injected straggler delay;
* ASP: every worker step is a global step, so the cluster rate is ``Σ eff/t_i``, capped by what
  the parameter servers can serve, ``bandwidth·#PS / (8 bytes·weights)`` (CM-DARE's saturation);
* BSP: one global step waits for the slowest worker, then for the PS to aggregate N gradients:
  ``max_i t_i + c·N``, ``c`` fitted on Sync-Switch's 8-worker BSP runs.
"""

from __future__ import annotations

import functools
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.simulate.fit import PARAMS_FILE, PARAMS_SCHEMA_VERSION

#: Key of a CPU worker in the step-time table: only a calibration of this machine adds it
#: (:mod:`orchestrator.simulate.calibrate`); the papers measured GPUs only.
CPU = "cpu"


#: GPU types whose speed draws are quasi-random, each with its own prime base (Halton).
_SPEED_KEYS = ("k80", "p100", "v100", "t4", "a100", "l4", CPU, "h100", "h200")
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23)


def _radical_inverse(n: int, base: int) -> float:
    """The van der Corput point of ``n`` in ``base``: its digits mirrored after the point."""
    out, scale = 0.0, 1.0 / base
    while n:
        n, digit = divmod(n, base)
        out += digit * scale
        scale /= base
    return out


class NoModelError(ValueError):
    """The fitted models cannot predict this setup (e.g. a model or GPU never measured)."""


@functools.lru_cache(maxsize=4)
def load_params(path: str | None = None) -> dict[str, Any]:
    """The exported parameters (cached per process: read once, ~100 kB)."""
    data = json.loads(Path(path or PARAMS_FILE).read_text())
    if data.get("schema_version") != PARAMS_SCHEMA_VERSION:
        raise ValueError(f"{path or PARAMS_FILE}: schema_version {data.get('schema_version')} "
                         f"(expected {PARAMS_SCHEMA_VERSION}); re-export with "
                         "python -m orchestrator.simulate.fit")
    return data


@dataclass(frozen=True)
class SimModels:
    """Typed access to the parameters."""

    params: dict[str, Any]

    @classmethod
    def load(cls, path: str | None = None) -> SimModels:
        return cls(load_params(path))

    # --- speed --------------------------------------------------------------------------
    def step_time_s(self, hparam_set: str, gpu: str | None, batch_size: int) -> float:
        """One worker's seconds per step; NoModelError when the speed model has no answer."""
        table = self.params["step_time_s"].get(hparam_set)
        if table is None:
            raise NoModelError(f"no speed model for job.hparam_set '{hparam_set}' "
                               f"(known: {', '.join(sorted(self.params['step_time_s']))})")
        key = gpu or CPU
        if key not in table:
            raise NoModelError(f"no speed model for GPU '{gpu}' "
                               f"(known: {', '.join(sorted(table))}; CPU workers are not modelled)")
        return table[key] * batch_size / self.params["batch_size"]

    def step_time_error(self, hparam_set: str, gpu: str | None) -> dict[str, Any]:
        """How far the step time of ``gpu`` may be off: ``sigma_log`` (log-normal spread a
        simulated run draws from), ``basis`` (measured | speed model | extrapolated |
        calibrated), ``tflops_outside`` and ``supported``/``support`` (see
        :func:`orchestrator.simulate.fit.step_time_errors`). A calibration on that hardware
        replaces the entry."""
        entry = self.params["step_time_error"]["by_job"].get(hparam_set, {}).get(gpu or CPU)
        if entry is None:  # a calibrated CPU without its own entry: a measurement
            return {"sigma_log": self.params["step_time_error"]["model"]["measured"],
                    "basis": "calibrated", "tflops_outside": 0.0}
        return entry

    def extrapolated(self, hparam_set: str, gpu: str | None) -> bool:
        """True when the step time of ``gpu`` is the speed model scaled to a GPU it was not
        fitted on (and no calibration on that GPU replaced it)."""
        return self.step_time_error(hparam_set, gpu)["basis"] == "extrapolated"

    def supported(self, hparam_set: str, gpu: str | None) -> tuple[bool, str]:
        """Whether anything supports the step time of ``gpu``, and what (one line): a
        measurement or calibration; an interpolation between measured GPUs; or public
        throughputs of that GPU agreeing with the speed model (:func:`orchestrator.simulate.fit.
        speed_support`). False: the figure is an extrapolation nothing checks, and a table
        should say so rather than print it as likely."""
        entry = self.step_time_error(hparam_set, gpu)
        if entry["basis"] == "calibrated":
            return True, "calibrated on this GPU"
        return entry.get("supported", True), entry.get("support", entry["basis"])

    def speed_factor(self, hparam_set: str, gpu: str | None, seed: int) -> float:
        """Run ``seed``'s draw of (true step time) / (predicted step time): log-normal with the
        model's held-out error, median 1 (the prediction).

        Quasi-random: the quantile of run ``seed`` is the Halton point of ``seed + 1`` (one
        prime base per GPU type, so a mixed cluster's errors are not tied), shifted by a fixed
        offset per GPU type. Any run of consecutive seeds then covers the distribution evenly:
        with a 3 % chance that an L4 is 4.5× slower than predicted, 200 runs hold 6 such
        draws, not "between 0 and 13" as independent draws would, so a P(deadline) that hinges
        on the speed model's tail is right from a few hundred runs (docs/simulation.md)."""
        sigma = self.step_time_error(hparam_set, gpu)["sigma_log"]
        key = gpu or CPU
        base = _PRIMES[_SPEED_KEYS.index(key)] if key in _SPEED_KEYS else None
        shift = random.Random(f"speed-shift/{key}").random()
        u = (_radical_inverse(seed + 1, base) + shift) % 1.0 if base else (
            random.Random(f"speed/{key}/{seed}").random())
        u = min(max(u, 1e-12), 1 - 1e-12)
        return math.exp(sigma * statistics.NormalDist().inv_cdf(u))

    def train_time_s(self, hparam_set: str, batch_size: int, worker_gpus: list[str | None],
                     parameter_servers: int, phases: list[tuple[str, int]],
                     checkpoints: int) -> float:
        """Seconds of training at the speed model's point estimate (all workers throughout,
        no revocation, no start-up): ``phases`` = [(protocol, global steps)], ``checkpoints``
        pauses of one checkpoint each. The plan's estimate and the scheduler's prediction; the
        simulation plays the same rates with revocations and the model's error."""
        times = [(self.step_time_s(hparam_set, g, batch_size), g) for g in worker_gpus]
        total = 0.0
        for protocol, steps in phases:
            if protocol == "asp":
                total += steps / self.asp_rate(times, hparam_set, parameter_servers)
            else:
                total += steps * self.bsp_step_s([t for t, _ in times])
        return total + checkpoints * self.checkpoint_s(hparam_set)

    def efficiency(self, gpu: str | None) -> float:
        eff = self.params["scaling"]["efficiency"]
        return eff.get(gpu or "", eff["default"])

    def ps_capacity(self, hparam_set: str, parameter_servers: int) -> float:
        """Global steps/s the PS can serve under ASP (CM-DARE's saturation, per PS)."""
        weights = self.params["parameters"][hparam_set]
        bandwidth = self.params["scaling"]["ps_bandwidth_bytes_per_s"]
        return bandwidth * parameter_servers / (8.0 * weights)

    def asp_rate(self, step_times: list[tuple[float, str | None]], hparam_set: str,
                 parameter_servers: int) -> float:
        """Cluster global steps/s of ASP workers ``[(step_s, gpu)]``, PS-capped."""
        linear = sum(self.efficiency(g) / t for t, g in step_times)
        return min(linear, self.ps_capacity(hparam_set, parameter_servers))

    def bsp_step_s(self, step_times: list[float]) -> float:
        """Seconds per BSP global step: the slowest worker plus the aggregation of N gradients."""
        return max(step_times) + self.params["bsp"]["sync_s_per_worker"] * len(step_times)

    # --- checkpoints --------------------------------------------------------------------
    def checkpoint_s(self, hparam_set: str) -> float:
        """Seconds to write one checkpoint (CM-DARE's linear model on the checkpoint size)."""
        ck = self.params["checkpoint"]
        if hparam_set in ck.get("measured_s", {}):  # calibrated on this machine
            return ck["measured_s"][hparam_set]
        size = ck["size_mb"].get(hparam_set)
        if size is None:
            size = ck["mb_per_million_weights"] * self.params["parameters"][hparam_set] / 1e6
        return ck["intercept_s"] + ck["slope_s_per_mb"] * size

    # --- start-up -----------------------------------------------------------------------
    @property
    def local_start_s(self) -> float | None:
        """Seconds a role's process takes to be ready on this machine when calibrated (roles
        are processes here: no VM boots, a replacement is a new process); None otherwise."""
        return self.params.get("machine", {}).get("start_s")

    def vm_startup_s(self, transient: bool, rng: random.Random) -> float:
        """Provisioning + staging + booting of one VM (CM-DARE start-up measurements)."""
        if self.local_start_s is not None:
            return 0.0
        d = self.params["startup"]["vm"]["transient" if transient else "on_demand"]
        return max(0.0, rng.gauss(d["mean_s"], d["std_s"]))

    def replacement_s(self, gpu: str | None, rng: random.Random) -> float:
        """Request to ready of a replacement server (CM-DARE, same region); CPU hosts and GPUs
        without a measurement use the mean over the measured GPUs."""
        table = self.params["startup"]["replacement"]
        if gpu in table:
            d = table[gpu]
        else:
            d = {"mean_s": sum(v["mean_s"] for v in table.values()) / len(table),
                 "std_s": max(v["std_s"] for v in table.values())}
        return max(0.0, rng.gauss(d["mean_s"], d["std_s"]))

    def tf_start_s(self, cold: bool, rng: random.Random) -> float:
        """TensorFlow process start before training (cold: first start on a VM)."""
        if self.local_start_s is not None:
            return self.local_start_s
        d = self.params["startup"]["tf_start"]["cold" if cold else "warm"]
        return max(0.0, rng.gauss(d["mean_s"], d["std_s"]))

    # --- lifetimes and accuracy ---------------------------------------------------------
    def lifetime_models(self, dataset: str) -> dict[str, Any]:
        try:
            return self.params["lifetimes"][dataset]
        except KeyError:
            raise NoModelError(f"no lifetime models '{dataset}' "
                               f"(known: {', '.join(self.params['lifetimes'])})") from None

    def accuracy(self, hparam_set: str, problem: str, workers: int, bsp_fraction: float,
                 bsp_steps: int, transient: bool) -> tuple[float, str] | None:
        """The accuracy the papers measured for exactly this setup, with its source; None when
        no paper measured it (never interpolated)."""
        for row in self.params["accuracy"]:
            if (row["hparam_set"] == hparam_set and row["problem"] == problem
                    and row["workers"] == workers and row["bsp_steps"] == bsp_steps
                    and math.isclose(row["bsp_fraction"], bsp_fraction, abs_tol=1e-3)
                    and row["transient"] in (None, transient)):
                return row["accuracy"], row["source"]
        return None
