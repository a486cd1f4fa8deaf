"""Stragglers: the injection schedule, online detection, and Sync-Switch's online policy.

Three pure pieces the run loop composes:

* :class:`InjectionSchedule` — given run time and global step, how much delay each worker gets
  now (``conf/straggler/``); :meth:`InjectionSchedule.episodes` expands time-based injections
  into plain records that can travel in the trainer spec.
* :class:`StragglerDetector` — fed one step time per worker step, it says when a worker starts
  and stops straggling: above ``k`` × its peers' median step time for ``m`` consecutive steps.
* Sync policies (registered by name): given the phase schedule's protocol and the current
  stragglers, the protocol to run now. ``straggler_switch`` is Sync-Switch's online policy.

Times are run seconds (since the chief's ``train_start``), as everywhere in the orchestrator.
"""

from __future__ import annotations

import abc
import statistics
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchestrator.config.transient import (
    StragglerDetection,
    StragglerInjection,
    SyncPolicyConfig,
    SyncPolicyName,
)
from orchestrator.transient.recovery import RecordedEvent
from trainer import events
from trainer.registry import Registry

EVENT_STRAGGLER_START = "straggler_start"  # worker, step_time_s, peer_median_s
EVENT_STRAGGLER_END = "straggler_end"  # worker, step_time_s, peer_median_s, duration_s
EVENT_POLICY_DECISION = "policy_decision"  # policy, protocol, previous, reason, stragglers
#: An injected straggler (InjectionSchedule) starts / ends: worker, delay_s / worker.
EVENT_STRAGGLER_INJECTION_START = "straggler_injection_start"
EVENT_STRAGGLER_INJECTION_END = "straggler_injection_end"
#: Recent step times kept per worker; a peer's typical time is the median of its window, so one
#: slow step of a peer (a GC pause, a checkpoint) does not move the threshold.
STEP_WINDOW = 5
BSP, ASP = "bsp", "asp"


# --- injection ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StragglerEpisode:
    """One episode: ``workers`` get ``delay_s`` per step from ``start_s`` until ``end_s``
    (None = until the end of the run)."""

    workers: tuple[int, ...]
    delay_s: float
    start_s: float
    end_s: float | None

    def active(self, now_s: float) -> bool:
        return self.start_s <= now_s and (self.end_s is None or now_s < self.end_s)


def _episodes_from(inj: StragglerInjection, first_start_s: float) -> list[StragglerEpisode]:
    count = inj.repeats if inj.every_s > 0 else 1
    episodes = []
    for j in range(count):
        start = first_start_s + j * inj.every_s
        end = None if inj.duration_s is None else start + inj.duration_s
        episodes.append(StragglerEpisode(tuple(inj.workers), inj.delay_s, start, end))
    return episodes


class InjectionSchedule:
    """Which workers are slowed down, by how much, at a given run time and step.

    A step-started injection is anchored at the run time of the first call that reports
    ``step ≥ start_step``; its recurrences are timed from there. So call :meth:`delays_at` with
    non-decreasing times; for purely time-based injections the answer depends only on ``now_s``.
    """

    def __init__(self, injections: Sequence[StragglerInjection], enabled: bool = True) -> None:
        self.injections = list(injections) if enabled else []
        self._anchored: dict[int, float] = {  # injection index -> first episode start
            i: inj.start_s for i, inj in enumerate(self.injections) if inj.start_s is not None
        }

    def delays_at(self, now_s: float, step: int) -> dict[int, float]:
        """Added seconds per step for each slowed worker now; overlapping injections add up.
        Workers not slowed are absent (an empty dict = nobody)."""
        for i, inj in enumerate(self.injections):
            if i not in self._anchored and inj.start_step is not None and step >= inj.start_step:
                self._anchored[i] = now_s
        delays: dict[int, float] = {}
        for episode in self.episodes():
            if episode.active(now_s):
                for worker in episode.workers:
                    delays[worker] = delays.get(worker, 0.0) + episode.delay_s
        return delays

    def episodes(self) -> list[StragglerEpisode]:
        """Every episode known so far (step-started injections once anchored), by start time."""
        out = [e for i, t in self._anchored.items() for e in _episodes_from(self.injections[i], t)]
        return sorted(out, key=lambda e: (e.start_s, e.workers))


# --- detection ------------------------------------------------------------------------------


@dataclass
class _WorkerTrack:
    window: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    slow_run: int = 0  # consecutive steps above the threshold
    normal_run: int = 0  # consecutive steps at or below it
    straggling_since_s: float | None = None
    last_report: object = None  # the report (chief's step) of the latest observation
    last_slow: bool = False  # that observation was above the threshold
    counted_slow: bool = False  # ... and counted in slow_run (undone if the report was shared)
    skip: bool = False  # ignore the next observation: it covers a shared stall


class StragglerDetector:
    """Online straggler detection over per-worker step times.

    A worker straggles once its step time exceeds ``k`` × the median of its *peers'* typical
    step times for ``m`` consecutive steps, and stops once it is back under for ``m``
    consecutive steps (symmetric hysteresis). Peers, not all workers: with two workers a median
    that includes the slow worker itself caps the ratio at 2, so k ≥ 2 could never fire.
    A worker with no peer reporting yet is never judged.

    A slowdown every worker shares is not a straggler: a frozen parameter server (or a
    network stall) stops all of them at once, and the first report afterwards shows every
    worker's step time inflated together. Two rules keep such a stall from blaming anyone:

    * ``report`` (the chief's step of the ``worker_steps`` report): when every worker's step
      in one report was slow, none of them counts (those judged earlier in it are taken back
      once the last one arrives; with ``m`` = 1 an earlier one may already have started).
    * :meth:`hold` / :meth:`release`: while a shared dependency is known silent (the chief's
      ``ps_unresponsive``), nothing is judged and the runs of slow steps start again; after
      it answers, each worker's next report (which covers the stall) is not judged either.
    """

    def __init__(self, k: float, m: int) -> None:
        assert k > 1 and m >= 1, f"need k > 1 and m ≥ 1 (got k={k}, m={m})"
        self.k, self.m = k, m
        self._tracks: dict[int, _WorkerTrack] = {}
        self._held: set[object] = set()  # what is silent now (e.g. "ps0")

    def hold(self, what: object) -> None:
        """A dependency every worker shares stopped answering: judge nobody until
        :meth:`release`, and forget the runs of slow steps so far (they may be its start)."""
        self._held.add(what)
        for track in self._tracks.values():
            track.slow_run = 0
            track.counted_slow = False

    def release(self, what: object = None) -> None:
        """``what`` answers again (None: everything held, e.g. the cluster restarts and its
        chief, who named them, with it); once nothing is held, each worker's next report
        (its step times span the stall) is skipped."""
        if what is None:
            self._held.clear()
        self._held.discard(what)
        if not self._held:
            for track in self._tracks.values():
                track.skip = True

    @classmethod
    def from_config(cls, cfg: StragglerDetection) -> StragglerDetector:
        return cls(cfg.k, cfg.m)

    @property
    def stragglers(self) -> frozenset[int]:
        """Workers straggling now."""
        return frozenset(w for w, t in self._tracks.items() if t.straggling_since_s is not None)

    def observe(self, worker: int, step_time_s: float, now_s: float,
                report: object = None) -> RecordedEvent | None:
        """Fold in one step of ``worker``; a straggler_start/_end event when its state flips.
        ``report``: what identifies the report it came in (None: no shared-slowdown rule)."""
        track = self._tracks.setdefault(worker, _WorkerTrack())
        if self._held or track.skip:  # a shared stall: not this worker's speed
            track.skip = False
            return None
        track.window.append(step_time_s)
        peers = [statistics.median(t.window) for w, t in self._tracks.items()
                 if w != worker and t.window]
        if not peers:
            return None
        median = statistics.median(peers)
        slow = step_time_s > self.k * median
        track.last_report, track.last_slow, track.counted_slow = report, slow, False
        others = [t for w, t in self._tracks.items() if w != worker and t.window]
        shared = slow and report is not None and all(
            t.last_report == report and t.last_slow for t in others)
        if shared:  # every worker was slow in this report: a shared stall, nobody's fault
            for peer in others:
                if peer.counted_slow:
                    peer.slow_run, peer.counted_slow = max(0, peer.slow_run - 1), False
        elif slow:
            track.slow_run, track.normal_run = track.slow_run + 1, 0
            track.counted_slow = True
        else:
            track.slow_run, track.normal_run = 0, track.normal_run + 1
        fields = {"worker": worker, "step_time_s": round(step_time_s, 6),
                  "peer_median_s": round(median, 6), "k": self.k, "m": self.m}
        if track.straggling_since_s is None and track.slow_run >= self.m:
            track.straggling_since_s = now_s
            return RecordedEvent(EVENT_STRAGGLER_START, fields)
        if track.straggling_since_s is not None and track.normal_run >= self.m:
            duration = now_s - track.straggling_since_s
            track.straggling_since_s = None
            return RecordedEvent(EVENT_STRAGGLER_END, {**fields, "duration_s": round(duration, 3)})
        return None

    def forget(self, worker: int, now_s: float) -> RecordedEvent | None:
        """Drop a lost worker; a straggler_end (reason ``lost``) if it was straggling."""
        track = self._tracks.pop(worker, None)
        if track is None or track.straggling_since_s is None:
            return None
        return RecordedEvent(EVENT_STRAGGLER_END, {
            "worker": worker, "reason": "lost",
            "duration_s": round(now_s - track.straggling_since_s, 3)})


def judge_trainer_event(detector: StragglerDetector, kind: str, fields: Mapping[str, Any],
                        now_s: float) -> RecordedEvent | None:
    """Route one chief event to ``detector`` (the run's one rule, shared by the supervisor
    and the tests that replay a real chief's events): ``worker_steps`` is judged per report
    (its ``step``), ``ps_unresponsive``/``ps_responsive`` hold and release judgement. A
    straggler_start/_end event when a worker's state flips."""
    if kind == events.EVENT_WORKER_STEPS:
        worker, step_time = fields.get("worker"), fields.get("step_time_s")
        if isinstance(worker, int) and worker >= 0 and isinstance(step_time, int | float):
            return detector.observe(worker, float(step_time), now_s, fields.get("step"))
    elif kind == events.EVENT_PS_UNRESPONSIVE:  # a frozen PS stalls every worker: blame none
        detector.hold(f"ps{fields.get('ps')}")
    elif kind == events.EVENT_PS_RESPONSIVE:
        detector.release(f"ps{fields.get('ps')}")
    return None


# --- online synchronisation policies ----------------------------------------------------------


@dataclass(frozen=True)
class PolicyDecision:
    """The protocol to run now. ``override`` True = it differs from the phase schedule's, so the
    loop must command it; ``event`` is set (to record) only when a policy switched."""

    protocol: str
    override: bool
    changed: bool
    reason: str
    event: RecordedEvent | None = None


_SYNC_POLICIES: Registry[type[SyncPolicy]] = Registry("sync policy")


def register_sync_policy(cls: type[SyncPolicy]) -> type[SyncPolicy]:
    return _SYNC_POLICIES.register(cls.name, cls)


def get_sync_policy(cfg: SyncPolicyConfig) -> SyncPolicy:
    """The policy named by ``cfg.policy``; UnknownNameError (a ValueError) naming the valid
    ones otherwise."""
    return _SYNC_POLICIES.get(str(cfg.policy))(cfg)


class SyncPolicy(abc.ABC):
    """Maps (run time, the phase schedule's protocol, current stragglers) to a protocol."""

    name: ClassVar[str]

    def __init__(self, cfg: SyncPolicyConfig) -> None:
        self.cfg = cfg

    @abc.abstractmethod
    def decide(self, now_s: float, phase_protocol: str,
               stragglers: Collection[int]) -> PolicyDecision:
        """Call on every tick (and whenever the stragglers change), with non-decreasing time."""


@register_sync_policy
class FollowSchedule(SyncPolicy):
    """No online policy: always the phase schedule's protocol."""

    name = SyncPolicyName.none.value

    def decide(self, now_s: float, phase_protocol: str,
               stragglers: Collection[int]) -> PolicyDecision:
        return PolicyDecision(phase_protocol, False, False, "phase schedule")


@register_sync_policy
class StragglerSwitchPolicy(SyncPolicy):
    """Sync-Switch's online policy: during a BSP phase, switch to ASP while a straggler persists
    (BSP waits for the slowest worker at every step; ASP does not), back to BSP once it is gone.

    Hysteresis, so it does not flap: a switch happens at least ``min_dwell_s`` after the last
    one, and the way back needs ``calm_s`` straggler-free seconds. Persistence is the
    detector's job (``m`` consecutive slow steps). ``switch_back`` False switches once and stays
    in ASP (the paper's policy 2). In an ASP phase nobody waits for a straggler: no override.
    """

    name = SyncPolicyName.straggler_switch.value

    def __init__(self, cfg: SyncPolicyConfig) -> None:
        super().__init__(cfg)
        self._override = False  # running ASP inside a BSP phase
        self._last_switch_s: float | None = None
        self._calm_since_s: float | None = None
        self._switches = 0

    def decide(self, now_s: float, phase_protocol: str,
               stragglers: Collection[int]) -> PolicyDecision:
        if stragglers:
            self._calm_since_s = None
        elif self._calm_since_s is None:
            self._calm_since_s = now_s
        if phase_protocol != BSP:
            changed, self._override = self._override, False
            return PolicyDecision(phase_protocol, False, changed, "phase schedule")
        dwelt = self._last_switch_s is None or now_s - self._last_switch_s >= self.cfg.min_dwell_s
        if not self._override and stragglers and dwelt and (
                self.cfg.switch_back or self._switches == 0):
            return self._switch(now_s, True, f"straggler(s) {sorted(stragglers)} persist",
                                stragglers)
        calm = self._calm_since_s is not None and now_s - self._calm_since_s >= self.cfg.calm_s
        if self._override and self.cfg.switch_back and calm and dwelt:
            return self._switch(now_s, False, f"no straggler for {self.cfg.calm_s:g} s",
                                stragglers)
        protocol = ASP if self._override else BSP
        return PolicyDecision(protocol, self._override, False, "hold")

    def _switch(self, now_s: float, to_asp: bool, reason: str,
                stragglers: Collection[int]) -> PolicyDecision:
        self._override, self._last_switch_s = to_asp, now_s
        self._switches += 1
        protocol, previous = (ASP, BSP) if to_asp else (BSP, ASP)
        event = RecordedEvent(EVENT_POLICY_DECISION, {
            "policy": self.name, "protocol": protocol, "previous": previous, "reason": reason,
            "stragglers": sorted(stragglers)})
        return PolicyDecision(protocol, to_asp, True, reason, event)
