"""Recovery policies: what the run does when a server is lost, as decision records.

The run loop reports losses (:class:`HostLoss`) to a :class:`RecoveryPlanner`, which routes
them by role to a policy registered by name and returns :class:`RecoveryDecision` records: what
to do, from when, how many steps are lost, and the events to record. Policies only decide; the
supervisor acts, through the one owner of the cluster (:class:`orchestrator.runtime.fleet.Fleet`),
and hands the outcome back here to be recorded:

===========  ==================================================================================
action       what the supervisor does
===========  ==================================================================================
continue     nothing: training goes on with the remaining workers
replace      at ``execute_at_s``: ``fleet.replace(ids)`` (a host still running is restarted in
             place), start the role on each new host, record ``planner.replaced(...)`` (or
             ``planner.replacement_failed(...)`` on no capacity), then ``planner.end(...)``
restart      now: stop every role; at ``execute_at_s``: ``fleet.restart(ids)`` (gone hosts
             replaced, every role started again; the chief resumes from the checkpoint store);
             ``planner.end(...)`` once the chief reports ``train_start``. An attempt that fails
             (a role exits, the restart raises, or no ``train_start`` before its deadline) is
             closed with ``planner.attempt_failed(...)`` and its losses decided again: another
             attempt while ``max_restarts`` allows, else ``recovery_failed``
fail         end the run with status ``failed`` and ``error = decision.reason``
===========  ==================================================================================

So every ``recovery_start`` ends in ``recovery_end``, ``recovery_attempt_failed`` or
``recovery_failed``. Times (``now_s``, ``execute_at_s``) are run seconds, as in
:mod:`orchestrator.transient.revocation`. The replacement delay is a deadline the loop honours,
not a sleep: build the provider with no provisioning delay of its own
(``LocalProvider(provision_delay_s=0)``, the default).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchestrator.config.transient import RecoveryConfig
from provisioning.base import Cluster, Host, HostId, HostState, Role
from trainer.registry import Registry

EVENT_REVOCATION_NOTICE = "revocation_notice"  # host, host_id, role, notice_s (loop records it)
EVENT_REVOCATION = "revocation"  # host, host_id, role, cause
EVENT_SERVER_FAILURE = "server_failure"  # as revocation, for a crash that was not a revocation
EVENT_REPLACEMENT_REQUESTED = "replacement_requested"  # host, delay_s, ready_at_s
EVENT_REPLACEMENT_READY = "replacement_ready"  # host, host_id, endpoint, wait_s
EVENT_REPLACEMENT_FAILED = "replacement_failed"  # hosts, error (the run shrinks instead)
EVENT_RECOVERY_START = "recovery_start"  # policy, action, lost_steps, resume_step, attempt
EVENT_RECOVERY_END = "recovery_end"  # policy, action, lost_steps, duration_s
EVENT_RECOVERY_FAILED = "recovery_failed"  # policy, reason (the run fails)
EVENT_RECOVERY_ATTEMPT_FAILED = "recovery_attempt_failed"  # policy, attempt, reason, duration_s


class LossCause(enum.StrEnum):
    revoked = "revoked"  # the provider took the host (poll() says REVOKED)
    crashed = "crashed"  # the process died; the host may still be usable


class Action(enum.StrEnum):
    """What the run loop must execute (see the module docstring)."""

    proceed = "continue"
    replace = "replace"
    restart = "restart"
    fail = "fail"


@dataclass(frozen=True)
class HostLoss:
    """One lost server. ``host_gone`` False = its process died but the host can run again, so a
    restart reuses it instead of replacing it."""

    host_id: HostId
    host_name: str  # the slot name (worker-1); replacements keep it
    role: Role
    at_s: float  # run second the loss was seen
    cause: LossCause = LossCause.revoked
    host_gone: bool = True


@dataclass(frozen=True)
class TrainingProgress:
    """Where training stood when the loss was seen."""

    global_step: int
    last_checkpoint_step: int | None  # None = no checkpoint yet: a restart begins at step 0
    workers_alive: int  # workers still running after these losses


@dataclass(frozen=True)
class RecordedEvent:
    """An ``events.jsonl`` line to write: ``rec.event(e.kind, **e.fields)``."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecoveryDecision:
    """What to do about a group of losses. ``events`` are to be recorded now, in order."""

    action: Action
    policy: str
    losses: tuple[HostLoss, ...]
    execute_at_s: float  # run second from which to execute (now for continue/fail)
    replace_host_ids: tuple[HostId, ...] = ()  # hosts to swap for fresh ones in complete()
    lost_steps: int = 0  # steps since the last checkpoint, redone after a restart
    resume_step: int | None = None  # restart: the checkpoint step training resumes from
    attempt: int = 0  # restart: 1-based attempt number; 0 for worker policies
    reason: str = ""
    events: tuple[RecordedEvent, ...] = ()


def loss_events(losses: Sequence[HostLoss]) -> list[RecordedEvent]:
    """One ``revocation`` (or ``server_failure``) event per loss."""
    return [
        RecordedEvent(
            EVENT_REVOCATION if loss.cause == LossCause.revoked else EVENT_SERVER_FAILURE,
            {"host": loss.host_name, "host_id": loss.host_id, "role": str(loss.role),
             "cause": str(loss.cause)},
        )
        for loss in losses
    ]


# --- policies -------------------------------------------------------------------------------

_POLICIES: Registry[type[RecoveryPolicy]] = Registry("recovery policy")


def register_recovery_policy(cls: type[RecoveryPolicy]) -> type[RecoveryPolicy]:
    """Class decorator: make ``cls`` selectable by its ``name``."""
    return _POLICIES.register(cls.name, cls)


def get_recovery_policy(name: str, cfg: RecoveryConfig) -> RecoveryPolicy:
    """A new policy; raises UnknownNameError (a ValueError) naming the valid policies."""
    return _POLICIES.get(name)(cfg)


class RecoveryPolicy(abc.ABC):
    """Decides about a group of losses; :meth:`complete` executes the provider part."""

    name: ClassVar[str]

    def __init__(self, cfg: RecoveryConfig) -> None:
        self.cfg = cfg

    @abc.abstractmethod
    def recover(self, losses: Sequence[HostLoss], progress: TrainingProgress,
                now_s: float) -> RecoveryDecision:
        """The decision for ``losses`` seen at run second ``now_s``. Deterministic given the
        policy's state (only RestartFromCheckpoint keeps any: its attempt count)."""

    def _request_events(self, ids: Sequence[HostId], losses: Sequence[HostLoss], delay_s: float,
                        now_s: float) -> list[RecordedEvent]:
        names = {loss.host_id: loss.host_name for loss in losses}
        return [RecordedEvent(EVENT_REPLACEMENT_REQUESTED,
                              {"host": names[i], "host_id": i, "delay_s": delay_s,
                               "ready_at_s": round(now_s + delay_s, 3)}) for i in ids]


@register_recovery_policy
class ShrinkPolicy(RecoveryPolicy):
    """Carry on with the workers that are left (ICAC'19).

    The bet: the job finishes sooner with fewer workers now than by waiting 66-78 s for a
    replacement, and a cluster that loses a few workers loses little accuracy (ICAC'19 trained
    through revocations without replacing anyone).

    Example: revocation(worker-2) → recovery_start(shrink) → recovery_end(lost_steps=0); training
    goes on with N-1 workers. When the last worker goes: revocation → recovery_failed → fail.
    """

    name = "shrink"

    def recover(self, losses: Sequence[HostLoss], progress: TrainingProgress,
                now_s: float) -> RecoveryDecision:
        # 1. record the losses
        events = loss_events(losses)
        # 2. no worker left: nobody can train, and nothing is coming back
        if progress.workers_alive < 1:
            reason = ("every worker was lost and on_revocation=shrink replaces none; "
                      "set cluster.recovery.on_revocation=replace")
            events.append(RecordedEvent(EVENT_RECOVERY_FAILED, {"policy": self.name,
                                                                 "reason": reason}))
            return RecoveryDecision(Action.fail, self.name, tuple(losses), now_s,
                                    reason=reason, events=tuple(events))
        # 3. continue: the coordinator reschedules the lost worker's step elsewhere, no loss
        fields = {"policy": self.name, "action": Action.proceed.value, "lost_steps": 0,
                  "workers": progress.workers_alive}
        events.append(RecordedEvent(EVENT_RECOVERY_START, dict(fields)))
        events.append(RecordedEvent(EVENT_RECOVERY_END, {**fields, "duration_s": 0.0}))
        return RecoveryDecision(Action.proceed, self.name, tuple(losses), now_s,
                                events=tuple(events))


@register_recovery_policy
class ReplacePolicy(RecoveryPolicy):
    """Acquire a replacement after the provisioning delay; it joins the running job (CM-DARE).

    The bet: the run is long compared with the 66-78 s a replacement takes, so restoring the
    cluster's throughput pays for the wait; the replacement needs no restart because TF's
    coordinator adds a worker that serves at the lost one's address slot.

    Example: revocation(worker-1) → recovery_start(replace) → replacement_requested(delay 70 s)
    … 70 s … replacement_ready(worker-1, new id) → recovery_end(lost_steps=0). With no capacity:
    replacement_failed → recovery_end(action=continue): the run shrinks instead.
    """

    name = "replace"

    def recover(self, losses: Sequence[HostLoss], progress: TrainingProgress,
                now_s: float) -> RecoveryDecision:
        # 1. record the losses and the start of the recovery
        events = loss_events(losses)
        events.append(RecordedEvent(EVENT_RECOVERY_START,
                                    {"policy": self.name, "action": Action.replace.value,
                                     "lost_steps": 0, "workers": progress.workers_alive}))
        # 2. request one replacement per lost host, ready after the provisioning delay
        ids = tuple(loss.host_id for loss in losses)
        delay = self.cfg.replacement_delay_s
        events += self._request_events(ids, losses, delay, now_s)
        return RecoveryDecision(Action.replace, self.name, tuple(losses), now_s + delay,
                                replace_host_ids=ids, events=tuple(events))


@register_recovery_policy
class RestartFromCheckpoint(RecoveryPolicy):
    """Parameter-server or chief loss: restart the training cluster from the latest checkpoint
    on replacement servers, at most ``max_restarts`` times.

    The bet: PS and chief losses are rare (they belong on on-demand servers), so redoing the
    steps since the last checkpoint is cheaper than anything cleverer; but a server that keeps
    being lost means the cluster cannot finish, so retries are bounded.

    Example (checkpoint every 500 steps, lost at 1,240): revocation(ps-0) →
    recovery_start(attempt 1/2, lost_steps=240, resume_step=1000) → replacement_requested →
    replacement_ready → recovery_end(lost_steps=240). Third loss with max_restarts=2:
    revocation → recovery_failed(reason) → fail.
    """

    name = "restart_from_checkpoint"

    def __init__(self, cfg: RecoveryConfig) -> None:
        super().__init__(cfg)
        self.restarts = 0  # attempts decided so far (including the one in progress)

    def recover(self, losses: Sequence[HostLoss], progress: TrainingProgress,
                now_s: float) -> RecoveryDecision:
        # 1. record the losses
        events = loss_events(losses)
        lost = tuple(losses)
        # 2. bounded retries: past max_restarts the run fails with the reason
        if self.restarts >= self.cfg.max_restarts:
            who = ", ".join(loss.host_name for loss in losses)
            reason = (f"lost {who} after {self.restarts} restart(s) from checkpoint; "
                      f"cluster.recovery.max_restarts={self.cfg.max_restarts} is exhausted")
            events.append(RecordedEvent(EVENT_RECOVERY_FAILED, {"policy": self.name,
                                                                 "reason": reason}))
            return RecoveryDecision(Action.fail, self.name, lost, now_s, reason=reason,
                                    events=tuple(events))
        self.restarts += 1
        # 3. lost steps: everything since the last checkpoint is redone
        resume = progress.last_checkpoint_step or 0
        lost_steps = max(0, progress.global_step - resume)
        events.append(RecordedEvent(EVENT_RECOVERY_START, {
            "policy": self.name, "action": Action.restart.value, "lost_steps": lost_steps,
            "resume_step": resume, "attempt": self.restarts,
            "max_restarts": self.cfg.max_restarts}))
        # 4. gone hosts are replaced (after the provisioning delay); crashed ones are reused
        ids = tuple(loss.host_id for loss in losses if loss.host_gone)
        delay = self.cfg.replacement_delay_s if ids else 0.0
        events += self._request_events(ids, losses, delay, now_s)
        # 5. restart after the replacements are ready and the back-off has passed
        return RecoveryDecision(Action.restart, self.name, lost,
                                now_s + delay + self.cfg.restart_delay_s, replace_host_ids=ids,
                                lost_steps=lost_steps, resume_step=resume,
                                attempt=self.restarts, events=tuple(events))


def hosts_to_replace(cluster: Cluster, states: Mapping[HostId, HostState],
                     replace_ids: Sequence[HostId], restart: bool) -> tuple[list[HostId], bool]:
    """Which hosts a recovery swaps for fresh ones, and whether they keep their endpoints.

    The one rule of both players (the real run's :class:`orchestrator.runtime.fleet.Fleet` and
    the simulation): the hosts the decision names that are still in ``cluster``; a restart also
    every host that is not RUNNING by ``states`` (the provider's last answer), at any endpoint
    (the new spec names the new ones); a replacement keeps the lost host's endpoint (a worker
    joins the live job at the address the others know)."""
    known = {host.id for host in cluster.hosts}
    named = [host_id for host_id in replace_ids if host_id in known]
    if not restart:
        return named, True
    return [host.id for host in cluster.hosts
            if host.id in named or states.get(host.id) != HostState.RUNNING], False


# --- routing and bookkeeping ---------------------------------------------------------------

#: Roles whose loss takes the whole training cluster down (TF's coordinator tolerates worker
#: loss, not PS loss; the chief *is* the coordinator).
RESTART_ROLES = (Role.PS, Role.CHIEF)


class RecoveryPlanner:
    """Routes losses to policies; the events it hands out are the run's record of recovery
    (:class:`orchestrator.rundir.record.RunState` counts them for the summary).

    Routing: any PS or chief among the losses → one ``restart_from_checkpoint`` decision for
    all of them (a restart re-deploys every role, and replaces every gone host, workers too);
    otherwise workers → ``cfg.on_revocation`` (shrink | replace); the evaluator → replace (it
    is stateless: it only reads checkpoints, and the run needs its final accuracy).
    """

    def __init__(self, cfg: RecoveryConfig) -> None:
        self.cfg = cfg
        self.policies = {name: get_recovery_policy(name, cfg)
                         for name in (str(cfg.on_revocation), ReplacePolicy.name,
                                      RestartFromCheckpoint.name)}

    def decide(self, losses: Sequence[HostLoss], progress: TrainingProgress,
               now_s: float) -> list[RecoveryDecision]:
        """Decisions for losses seen together (empty input → empty list)."""
        if not losses:
            return []
        if any(loss.role in RESTART_ROLES for loss in losses):
            groups = {RestartFromCheckpoint.name: list(losses)}
        else:
            groups = {}
            for loss in losses:
                name = str(self.cfg.on_revocation) if loss.role == Role.WORKER else "replace"
                groups.setdefault(name, []).append(loss)
        decisions = [self.policies[name].recover(group, progress, now_s)
                     for name, group in groups.items()]
        return decisions

    def retry_restart(self, losses: Sequence[HostLoss], progress: TrainingProgress,
                      now_s: float) -> RecoveryDecision:
        """After a failed restart attempt: another restart for ``losses`` (whatever their
        roles: the cluster is not training, so only a restart brings it back), or the failure
        once ``max_restarts`` attempts were made."""
        decision = self.policies[RestartFromCheckpoint.name].recover(losses, progress, now_s)
        return decision

    def replaced(self, decision: RecoveryDecision, new_hosts: Sequence[Host],
                 now_s: float) -> list[RecordedEvent]:
        """Record the hosts the supervisor got for ``decision`` (one replacement_ready each,
        with the wait since the loss)."""
        lost_at = min(loss.at_s for loss in decision.losses)
        events = [RecordedEvent(EVENT_REPLACEMENT_READY,
                                {"host": h.spec.name, "host_id": h.id, "role": str(h.role),
                                 "endpoint": h.endpoint, "wait_s": round(now_s - lost_at, 3)})
                  for h in new_hosts]
        return events

    def replacement_failed(self, decision: RecoveryDecision, error: str) -> list[RecordedEvent]:
        """No capacity for a worker's replacement: the run carries on without it (shrink)."""
        events = [RecordedEvent(EVENT_REPLACEMENT_FAILED,
                                {"hosts": [loss.host_name for loss in decision.losses],
                                 "error": error})]
        return events

    def attempt_failed(self, decision: RecoveryDecision, reason: str,
                       now_s: float) -> RecordedEvent:
        """Close a restart attempt that failed before training resumed; the caller decides
        its losses again (another attempt, or recovery_failed once max_restarts is spent)."""
        event = RecordedEvent(EVENT_RECOVERY_ATTEMPT_FAILED, {
            "policy": decision.policy, "attempt": decision.attempt, "reason": reason,
            "duration_s": round(now_s - min(loss.at_s for loss in decision.losses), 3)})
        return event

    def end(self, decision: RecoveryDecision, now_s: float, ok: bool = True) -> RecordedEvent:
        """The recovery_end event, once the recovered cluster trains again. ``ok`` False (no
        replacement capacity) records that the run continued without the lost workers."""
        action = decision.action.value if ok else Action.proceed.value
        event = RecordedEvent(EVENT_RECOVERY_END, {
            "policy": decision.policy, "action": action, "lost_steps": decision.lost_steps,
            "duration_s": round(now_s - min(loss.at_s for loss in decision.losses), 3)})
        return event
