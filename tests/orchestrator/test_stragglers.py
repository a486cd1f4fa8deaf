"""Straggler injection, detection thresholds, the Sync-Switch policy's hysteresis, and configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from orchestrator.config.errors import ConfigError
from orchestrator.config.transient import (
    RecoveryConfig,
    RevocationConfig,
    RevocationEventConfig,
    RevocationModel,
    StragglerConfig,
    StragglerDetection,
    StragglerInjection,
    SyncPolicyConfig,
    SyncPolicyName,
    register_transient_configs,
    validate_recovery,
    validate_revocation,
    validate_straggler,
    validate_sync_policy,
)
from orchestrator.transient.stragglers import (
    EVENT_POLICY_DECISION,
    EVENT_STRAGGLER_END,
    EVENT_STRAGGLER_START,
    InjectionSchedule,
    StragglerDetector,
    get_sync_policy,
)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
NORMAL_S, SLOW_S = 0.10, 0.30


def feed(det: StragglerDetector, times: dict[int, float], now_s: float) -> list[str]:
    """One step of every worker; the kinds of the events it produced."""
    events = [det.observe(w, t, now_s) for w, t in times.items()]
    return [e.kind for e in events if e is not None]


class TestInjectionSchedule:
    def test_recurring_episodes_switch_on_and_off(self) -> None:
        inj = StragglerInjection(workers=[1], delay_s=0.2, start_s=10.0, duration_s=5.0,
                                 every_s=30.0, repeats=2)
        s = InjectionSchedule([inj])
        assert [s.delays_at(t, 0) for t in (9.9, 10.0, 14.9, 15.0, 40.0, 45.0, 70.0)] == [
            {}, {1: 0.2}, {1: 0.2}, {}, {1: 0.2}, {}, {}]
        assert [(e.start_s, e.end_s) for e in s.episodes()] == [(10.0, 15.0), (40.0, 45.0)]

    def test_overlapping_injections_add_up_and_none_duration_lasts(self) -> None:
        s = InjectionSchedule([
            StragglerInjection(workers=[0, 1], delay_s=0.1, start_s=0.0),
            StragglerInjection(workers=[1], delay_s=0.2, start_s=5.0, duration_s=1.0)])
        assert s.delays_at(5.5, 0) == {0: 0.1, 1: pytest.approx(0.3)}
        assert s.delays_at(1e6, 0) == {0: 0.1, 1: 0.1}

    def test_step_started_injection_is_anchored_when_the_step_is_reached(self) -> None:
        s = InjectionSchedule([StragglerInjection(workers=[2], delay_s=0.5, start_step=100,
                                                  duration_s=10.0)])
        assert s.delays_at(3.0, 99) == {} and s.episodes() == []
        assert s.delays_at(4.0, 100) == {2: 0.5}
        assert s.delays_at(13.9, 150) == {2: 0.5} and s.delays_at(14.0, 160) == {}

    def test_disabled_injects_nothing(self) -> None:
        inj = StragglerInjection(workers=[0], delay_s=1.0, start_s=0.0)
        assert InjectionSchedule([inj], enabled=False).delays_at(1.0, 1) == {}


class TestStragglerDetector:
    def test_starts_after_exactly_m_consecutive_slow_steps(self) -> None:
        det = StragglerDetector(k=1.5, m=3)
        feed(det, {0: NORMAL_S, 1: NORMAL_S, 2: NORMAL_S}, 0.0)
        kinds = [feed(det, {0: NORMAL_S, 1: SLOW_S, 2: NORMAL_S}, t) for t in (1.0, 2.0, 3.0)]
        assert kinds == [[], [], [EVENT_STRAGGLER_START]]
        assert det.stragglers == {1}

    def test_an_interrupted_slow_run_does_not_fire(self) -> None:
        det = StragglerDetector(k=1.5, m=3)
        for i, t in enumerate([SLOW_S, SLOW_S, NORMAL_S, SLOW_S, SLOW_S, NORMAL_S]):
            assert feed(det, {0: NORMAL_S, 1: t, 2: NORMAL_S}, float(i)) == []
        assert det.stragglers == frozenset()

    def test_threshold_is_strictly_above_k_times_the_median(self) -> None:
        det = StragglerDetector(k=2.0, m=1)
        feed(det, {0: 0.1, 1: 0.1}, 0.0)
        assert feed(det, {1: 0.2}, 1.0) == []  # exactly 2 × the peer median: not slow
        assert feed(det, {1: 0.2001}, 2.0) == [EVENT_STRAGGLER_START]

    def test_two_workers_with_k_two_can_detect(self) -> None:
        det = StragglerDetector(k=2.0, m=2)
        events = [feed(det, {0: 0.1, 1: 0.5}, float(t)) for t in range(3)]
        assert [EVENT_STRAGGLER_START] in events and det.stragglers == {1}

    def test_ends_after_m_normal_steps_with_its_duration(self) -> None:
        det = StragglerDetector(k=1.5, m=2)
        for t in range(3):
            feed(det, {0: NORMAL_S, 1: SLOW_S, 2: NORMAL_S}, float(t))
        assert det.stragglers == {1}
        assert feed(det, {0: NORMAL_S, 1: NORMAL_S, 2: NORMAL_S}, 10.0) == []
        end = [det.observe(1, NORMAL_S, 11.0)]
        assert end[0] is not None and end[0].kind == EVENT_STRAGGLER_END
        assert end[0].fields["duration_s"] == 10.0 and det.stragglers == frozenset()

    def test_a_lone_worker_is_never_judged_and_a_lost_straggler_ends(self) -> None:
        det = StragglerDetector.from_config(StragglerDetection(k=1.5, m=1))
        assert det.observe(0, 5.0, 0.0) is None
        feed(det, {1: NORMAL_S}, 0.0)
        feed(det, {0: SLOW_S}, 1.0)
        event = det.forget(0, 4.0)
        assert event is not None and event.fields == {"worker": 0, "reason": "lost",
                                                      "duration_s": 3.0}
        assert det.forget(0, 5.0) is None


class TestSharedStall:
    """A frozen parameter server stalls every worker at once: nobody is a straggler."""

    @staticmethod
    def report(det: StragglerDetector, times: dict[int, float], step: int) -> list[str]:
        """One ``worker_steps`` report (the chief's step ``step``): every worker's mean."""
        events = [det.observe(w, t, float(step), report=step) for w, t in times.items()]
        return [e.kind for e in events if e is not None]

    def test_every_worker_slow_in_the_same_reports_blames_nobody(self) -> None:
        det = StragglerDetector(k=1.5, m=3)
        for step in (10, 20, 30):
            assert self.report(det, {0: NORMAL_S, 1: NORMAL_S}, step) == []
        # the PS froze: its readers stalled together, three reports in a row
        for step in (40, 50, 60):
            assert self.report(det, {0: 2.5, 1: 2.6}, step) == []
        assert det.stragglers == frozenset()
        # the same numbers without report ids: judged one by one, worker 0 is blamed
        plain = StragglerDetector(k=1.5, m=3)
        for now in (1.0, 2.0, 3.0):
            feed(plain, {0: NORMAL_S, 1: NORMAL_S}, now)
        kinds = [feed(plain, {0: 2.5, 1: 2.6}, now) for now in (4.0, 5.0, 6.0)]
        assert kinds[-1] == [EVENT_STRAGGLER_START] and plain.stragglers == {0}

    def test_one_slow_worker_among_normal_ones_is_still_a_straggler(self) -> None:
        det = StragglerDetector(k=1.5, m=3)
        self.report(det, {0: NORMAL_S, 1: NORMAL_S, 2: NORMAL_S}, 10)
        kinds = [self.report(det, {0: NORMAL_S, 1: SLOW_S, 2: NORMAL_S}, step)
                 for step in (20, 30, 40)]
        assert kinds == [[], [], [EVENT_STRAGGLER_START]], kinds
        assert det.stragglers == {1}

    def test_nothing_is_judged_while_a_ps_is_silent_nor_the_report_spanning_it(self) -> None:
        det = StragglerDetector(k=1.5, m=2)
        for now in (1.0, 2.0):
            feed(det, {0: NORMAL_S, 1: NORMAL_S}, now)
        feed(det, {0: SLOW_S, 1: NORMAL_S}, 3.0)  # one slow step of worker 0 before the freeze
        det.hold("ps0")
        assert feed(det, {0: 25.0}, 4.0) == []  # worker 0's closure spanned the freeze
        det.release("ps0")
        # the first report after it still spans the stall: worker 0's only, unequally
        assert feed(det, {0: 12.0, 1: NORMAL_S}, 5.0) == []
        assert feed(det, {0: NORMAL_S, 1: NORMAL_S}, 6.0) == []
        assert det.stragglers == frozenset()
        # once running normally again, a real straggler is found as before
        kinds = [feed(det, {0: SLOW_S, 1: NORMAL_S}, now) for now in (7.0, 8.0)]
        assert kinds == [[], [EVENT_STRAGGLER_START]]


class TestStragglerSwitchPolicy:
    def policy(self, **kw: object):
        return get_sync_policy(SyncPolicyConfig(policy=SyncPolicyName.straggler_switch, **kw))

    def test_switches_to_asp_while_a_straggler_persists_and_back_when_calm(self) -> None:
        p = self.policy(min_dwell_s=0.0, calm_s=5.0)
        assert p.decide(0.0, "bsp", set()).protocol == "bsp"
        d = p.decide(1.0, "bsp", {2})
        assert (d.protocol, d.override, d.changed) == ("asp", True, True)
        assert d.event is not None and d.event.kind == EVENT_POLICY_DECISION
        assert d.event.fields["stragglers"] == [2]
        assert p.decide(3.0, "bsp", {2}).protocol == "asp"
        assert p.decide(4.0, "bsp", set()).protocol == "asp"  # calm for 0 s
        assert p.decide(8.9, "bsp", set()).protocol == "asp"  # calm for 4.9 s
        back = p.decide(9.0, "bsp", set())
        assert (back.protocol, back.override, back.changed) == ("bsp", False, True)

    def test_min_dwell_stops_flapping(self) -> None:
        p = self.policy(min_dwell_s=10.0, calm_s=0.0)
        stragglers = [{1}, set(), {1}, set(), {1}, set()]
        switches = [p.decide(float(t), "bsp", s).changed for t, s in enumerate(stragglers)]
        assert switches == [True, False, False, False, False, False]
        assert p.decide(10.0, "bsp", set()).protocol == "bsp"  # dwell passed, calm

    def test_switch_once_stays_in_asp(self) -> None:
        p = self.policy(min_dwell_s=0.0, calm_s=0.0, switch_back=False)
        assert p.decide(0.0, "bsp", {0}).protocol == "asp"
        assert p.decide(100.0, "bsp", set()).protocol == "asp"

    def test_no_override_in_an_asp_phase(self) -> None:
        p = self.policy(min_dwell_s=0.0)
        p.decide(0.0, "bsp", {0})
        d = p.decide(1.0, "asp", {0})
        assert (d.protocol, d.override) == ("asp", False)

    def test_none_policy_follows_the_schedule(self) -> None:
        p = get_sync_policy(SyncPolicyConfig())
        assert p.decide(0.0, "bsp", {0, 1}).protocol == "bsp"


class TestTransientConfigs:
    @pytest.mark.parametrize(("group", "schema"), [("revocation", RevocationConfig),
                                                   ("straggler", StragglerConfig)])
    def test_every_option_fills_its_schema(self, group: str, schema: type) -> None:
        files = sorted((CONF_DIR / group).glob("*.yaml"))
        assert files
        for path in files:
            data = yaml.safe_load(path.read_text())
            assert data.pop("defaults") == [f"base_{group}", "_self_"], path
            obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), data))
            assert obj.name == path.stem
            if group == "revocation":
                validate_revocation(obj)
            else:
                validate_straggler(obj)

    def test_register_stores_base_schemas(self) -> None:
        from hydra.core.config_store import ConfigStore

        register_transient_configs()
        repo = ConfigStore.instance().repo
        assert {"base_revocation.yaml"} <= set(repo["revocation"])
        assert {"base_straggler.yaml"} <= set(repo["straggler"])

    @pytest.mark.parametrize(("check", "cfg", "line"), [
        (validate_revocation, RevocationConfig(name="x", model=RevocationModel.exponential),
         "config error: revocation.rate_per_hour: must be > 0 (got 0)"),
        (validate_revocation, RevocationConfig(name="x", events=[
            RevocationEventConfig(target="worker", at_s=1.0, at_step=3)]),
         "config error: revocation.events.0: set exactly one of at_s and at_step"),
        (validate_recovery, RecoveryConfig(max_restarts=-1),
         "config error: cluster.recovery.max_restarts: must be ≥ 0 (got -1)"),
        (validate_straggler, StragglerConfig(name="x", detection=StragglerDetection(k=1.0)),
         "config error: straggler.detection.k: must be > 1 (got 1)"),
        (validate_sync_policy, SyncPolicyConfig(calm_s=-1.0),
         "config error: sync.policy.calm_s: must be ≥ 0 (got -1)"),
    ])
    def test_semantic_errors_name_the_field(self, check, cfg, line: str) -> None:
        with pytest.raises(ConfigError) as err:
            check(cfg)
        assert str(err.value) == line
