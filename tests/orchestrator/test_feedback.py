"""Feedback off a terminal (CI logs, ``| tee``): a line at each 10 %, after 30 s without one, and
at the end; a run's start-up phases and its steps the same way. A fake clock drives the time."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.feedback import Feedback
from orchestrator.runtime.progress import RunProgress
from orchestrator.simulate import reliability
from orchestrator.simulate.planner import parse_args, plan_experiment


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, soft_wrap=True, width=200), out


def test_feedback_prints_a_line_per_tenth_after_30_s_and_at_the_end() -> None:
    console, out = piped()
    clock = FakeClock()
    with Feedback("simulating 40 configurations", 40, console, clock) as fb:
        for i in range(40):
            fb.advance(note=f"cand-{i}")
    lines = out.getvalue().splitlines()
    assert lines[0] == "simulating 40 configurations: 0/40 (0%) started"
    # 4, 8, ... 36 of 40: one line per 10 %, not one per candidate; 40 is the final line's
    assert lines[1:-1] == [f"simulating 40 configurations: {k}/40 ({k * 100 // 40}%) "
                           f"cand-{k - 1}" for k in range(4, 40, 4)]
    assert lines[-1] == "simulating 40 configurations: 40/40 (100%) done in 0 s"

    console, out = piped()
    with Feedback("checking 1000 configurations", 1000, console, clock) as fb:
        fb.advance(note="a")  # 0.1 %: no line
        clock.now += 29.0
        fb.advance(note="b")  # 29 s since the start line: still none
        clock.now += 1.0
        fb.advance(note="c")  # 30 s: a line although no tenth was crossed
        fb.advance(note="d")  # and not again right after
        clock.now += 31.0
    assert out.getvalue().splitlines() == [
        "checking 1000 configurations: 0/1000 (0%) started",
        "checking 1000 configurations: 3/1000 (0%) c",
        "checking 1000 configurations: 4/1000 (0%) done in 61 s"]


def test_feedback_says_where_it_stopped_on_an_exception() -> None:
    console, out = piped()
    with pytest.raises(KeyboardInterrupt), Feedback("simulating 3 configurations", 3,
                                                    console, FakeClock()) as fb:
        fb.advance()
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-1] == (
        "simulating 3 configurations: 1/3 (33%) stopped after 0 s")


def test_feedback_on_a_terminal_draws_a_bar_and_prints_no_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with Feedback("simulating 2 configurations", 2, console, FakeClock()) as fb:
        fb.advance(note="8× t4")
        fb.advance(note="4× l4")
    text = out.getvalue()
    assert "simulating 2 configurations" in text and "2/2" in text
    assert "(100%)" not in text and "started" not in text  # the plain lines are for pipes


def test_run_progress_off_a_terminal_prints_phases_and_tenths_of_the_steps() -> None:
    console, out = piped()
    clock = FakeClock()
    with RunProgress("cifar10", 1000, console=console, clock=clock) as progress:
        progress.status("provisioning")
        progress.status("provisioning")  # the same phase again: no second line
        progress.status("starting roles")
        progress.status("training")
        for step in range(0, 1001, 10):
            progress.update(step, steps_per_sec=12.345, loss=0.5)
            if step == 150:
                progress.update(accuracy=0.25)
        progress.status("restarting from checkpoint")
        progress.update(900)  # back to the checkpoint: below the last tenth, no line
        clock.now += 30.0
        progress.update(910)  # 30 s without a line: one
    lines = out.getvalue().splitlines()
    assert lines[:4] == ["cifar10: started (1000 global steps)", "cifar10: provisioning",
                         "cifar10: starting roles", "cifar10: training"]
    steps = lines[4:14]
    assert steps[0] == "cifar10: 100/1000 (10%) global steps, 12.3 steps/s, loss 0.5000"
    assert steps[1] == ("cifar10: 200/1000 (20%) global steps, 12.3 steps/s, loss 0.5000, "
                        "acc 0.2500")
    assert [s.split()[1] for s in steps] == [f"{k}/1000" for k in range(100, 1001, 100)]
    assert lines[14:] == ["cifar10: restarting from checkpoint",
                          "cifar10: 910/1000 (91%) global steps, 12.3 steps/s, loss 0.5000, "
                          "acc 0.2500"]


def test_run_progress_off_a_terminal_says_a_long_phase_still_runs() -> None:
    """A VM that boots for minutes: no step, no phase change; a line after 30 s without one,
    naming the phase and how long it has run, and none while lines come."""
    console, out = piped()
    clock = FakeClock()
    with RunProgress("gce", 100, console=console, clock=clock) as progress:
        progress.status("provisioning")
        clock.now += 29.0
        progress.still()  # 29 s: not yet
        clock.now += 1.0
        progress.still()
        clock.now += 10.0
        progress.still()  # 10 s after the last line: no
        clock.now += 20.0
        progress.still()
        progress.status("training")
        clock.now += 5.0
        progress.still()
    assert out.getvalue().splitlines() == [
        "gce: started (100 global steps)", "gce: provisioning", "gce: provisioning, still (30 s)",
        "gce: provisioning, still (60 s)", "gce: training"]


def test_run_progress_off_a_terminal_runs_its_quiet_check_only_while_open() -> None:
    import threading

    console, _ = piped()
    with RunProgress("real", 10, console=console):
        assert any(t.name == "run-progress-still" for t in threading.enumerate())
    for thread in [t for t in threading.enumerate() if t.name == "run-progress-still"]:
        thread.join(10)  # it wakes within STILL_CHECK_S and sees it is stopped
    assert not any(t.name == "run-progress-still" for t in threading.enumerate())


def test_run_progress_with_progress_off_prints_only_its_start() -> None:
    console, out = piped()
    with RunProgress("quiet", 100, enabled=False, console=console) as progress:
        progress.status("provisioning")
        for step in range(101):
            progress.update(step)
    assert out.getvalue().splitlines() == ["quiet: started (100 global steps)"]


def test_the_planner_says_what_it_simulates_when_piped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The search's lines go to stderr (not a terminal under pytest), the answer to stdout."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no calibration of ours
    ranked, _ = plan_experiment(parse_args([
        "+experiment=cifar10_res32", "planner.zones=first", "planner.repeats=20",
        "planner.max_repeats=20", "planner.gpus=[l4,t4]", "planner.workers=[4]",
        "planner.bsp_fractions=[0.25]", "planner.transient=[true]", "planner.parameter_servers=[1]",
        "pricing=gce"]),
        out_dir=tmp_path / "plan")
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.startswith("simulating 2 configurations")]
    assert lines[0] == "simulating 2 configurations: 0/2 (0%) started"
    assert re.fullmatch(r"simulating 2 configurations: 1/2 \(50%\) 4× l4 transient \S+ "
                        r"BSP 25% → ASP", lines[1]), lines
    assert re.fullmatch(r"simulating 2 configurations: 2/2 \(100%\) done in \d+ s", lines[-1])
    assert "simulating" not in captured.out and "dry run of #1: " in captured.out
    assert len(ranked) == 2


def test_the_reliability_check_says_what_it_checks_on_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Its stdout is the markdown table alone; the search and the fresh runs report on stderr."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reliability.main(["+experiment=cifar10_res32", "deadline_h=3", "planner.zones=first",
                      "planner.repeats=20", "planner.max_repeats=20", "planner.gpus=[t4]",
                      "planner.workers=[4,8]", "planner.transient=[true]",
                      "planner.parameter_servers=[1]", "--fresh", "20"])
    out, err = capsys.readouterr()
    assert out.startswith("| cluster |") and "configurations" not in out.splitlines()[0]
    lines = err.splitlines()
    assert lines[0] == "simulating 2 configurations, each refined: 0/2 (0%) started"
    checks = [x for x in lines if x.startswith("checking 2 configurations on fresh seeds: ")]
    assert re.fullmatch(r"checking 2 configurations on fresh seeds: 1/2 \(50%\) 4× t4 transient "
                        r"\S+: printed \d+\.\d%, fresh \d+\.\d%", checks[1]), checks
    assert re.fullmatch(r".*: 2/2 \(100%\) done in \d+ s", checks[-1])


def test_run_progress_on_a_terminal_names_the_phase_in_its_bar() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=150)
    with RunProgress("digits [a]", 100, console=console) as progress:
        progress.status("provisioning")
    assert "digits [a] [provisioning]" in out.getvalue()  # not read as rich markup
    assert "started" not in out.getvalue()  # the bar, no plain lines
