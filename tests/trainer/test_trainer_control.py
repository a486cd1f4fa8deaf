"""Fast tests of the side channels (trainer/control.py), the budget accounting and the
in-graph straggler schedule (trainer/steps.py); the cluster tests exercise them live."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trainer import control
from trainer.events import parse_event
from trainer.spec import PhaseSpec, StragglerSpec


def test_budget_without_overrides_hits_the_phase_targets() -> None:
    phases = [PhaseSpec("bsp", 100), PhaseSpec("asp", 500), PhaseSpec("bsp", 600)]
    budget = control.Budget(phases, workers=4)
    assert budget.ends == [400, 400 + 400, 800 + 400]  # units of 1/4 BSP step
    assert budget.steps_left(0, 0, "bsp") == 100
    assert budget.steps_left(400, 1, "asp") == 400  # 400 ASP steps = 100 BSP-equivalent
    assert budget.steps_left(800, 2, "bsp") == 100
    assert [budget.units_at_step(s) for s in (0, 100, 300, 500, 600)] == [
        0, 400, 600, 800, 1200]


def test_budget_with_an_override_counts_bsp_equivalent_steps() -> None:
    budget = control.Budget([PhaseSpec("bsp", 300)], workers=2)  # 600 units
    used = 80 * budget.weight("bsp")  # 80 BSP steps, then the orchestrator says ASP
    assert budget.steps_left(used, 0, "asp") == 2 * (300 - 80)
    # ASP phase overridden to BSP: the remainder rounds up to whole BSP steps
    budget = control.Budget([PhaseSpec("asp", 101)], workers=2)
    assert budget.steps_left(0, 0, "bsp") == 51
    assert budget.steps_left(100, 0, "bsp") == 1 and budget.steps_left(101, 0, "bsp") == 0


def write_control(path: Path, **fields: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fields))
    tmp.replace(path)


def test_control_channel_polls_cheaply_and_acts_on_higher_seq(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    channel = control.ControlChannel(path, poll_s=0.0)
    assert channel.start() == control.Control() and channel.poll() is None  # no file yet
    write_control(path, seq=1, protocol="asp", checkpoint=1)
    assert channel.poll() == control.Control(1, "asp", 1)
    assert channel.take_checkpoint_request() and not channel.take_checkpoint_request()
    assert channel.poll() is None  # unchanged file: one stat, no read
    write_control(path, seq=1, protocol="bsp", checkpoint=5)
    assert channel.poll() is None and channel.state.protocol == "asp"  # same seq: ignored
    write_control(path, seq=2, protocol=None, checkpoint=1)
    assert channel.poll().protocol is None and not channel.take_checkpoint_request()
    path.write_text("{not json")
    assert channel.poll() is None and channel.state.seq == 2
    throttled = control.ControlChannel(path, poll_s=60.0)
    write_control(path, seq=3, protocol="asp", checkpoint=7)
    assert throttled.start().checkpoint == 7 and not throttled.take_checkpoint_request()
    write_control(path, seq=4, protocol="asp", checkpoint=8)
    assert throttled.poll() is None  # within poll_s of the last poll: not even a stat


def test_notice_watcher_emits_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "PREEMPTION_NOTICE"
    watcher = control.NoticeWatcher(str(path), poll_s=0.02).start()
    time.sleep(0.1)
    assert not watcher.received.is_set() and not watcher.take()
    path.write_text(json.dumps({"host_id": "h1", "deadline": 1234.5}))
    assert watcher.received.wait(2.0)
    assert watcher.take() and not watcher.take()
    events = [parse_event(line) for line in capsys.readouterr().out.splitlines()]
    notices = [e for e in events if e and e["kind"] == "preemption_notice"]
    assert len(notices) == 1 and notices[0]["deadline"] == 1234.5
    assert notices[0]["host_id"] == "h1"
    assert not control.NoticeWatcher(None).start().received.is_set()  # env unset: no thread


def test_unreachable_names_closed_ports() -> None:
    from trainer_harness import free_ports
    address = f"127.0.0.1:{free_ports(1)[0]}"
    assert control.unreachable([address], timeout_s=0.5) == [address]


def test_straggler_episodes_by_time_and_step() -> None:
    import tensorflow as tf

    from trainer.tfcompat import sleep
    from trainer.variables import straggler_delay

    episodes = [StragglerSpec(workers=[1], delay_s=0.2, start_s=10.0, end_s=20.0),
                StragglerSpec(workers=[0, 1], delay_s=0.1, start_step=50),
                StragglerSpec(workers=[2], delay_s=0.3, start_s=5.0)]

    def delay(worker: int, t: float, step: int) -> float:
        return float(straggler_delay(episodes, tf.constant(worker), tf.constant(t, tf.float64),
                                     tf.constant(step, tf.int64)))

    assert delay(1, 9.9, 0) == 0.0 and delay(1, 10.0, 0) == pytest.approx(0.2)
    assert delay(1, 20.0, 0) == 0.0 and delay(0, 15.0, 0) == 0.0
    assert delay(0, 0.0, 50) == pytest.approx(0.1) and delay(1, 15.0, 60) == pytest.approx(0.2)
    assert delay(2, 1e6, 0) == pytest.approx(0.3) and delay(2, 4.0, 99) == 0.0
    started = time.time()
    sleep(tf.constant(0.15, tf.float64))
    assert 0.14 <= time.time() - started < 1.0
