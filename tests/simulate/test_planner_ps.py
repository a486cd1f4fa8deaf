"""The planner varies the parameter servers, and an empty answer names the limit that binds
(issue 37). ResNet-32's one PS serves 44 steps/s (CM-DARE's saturation): 64k ASP steps take
at least 0.40 h behind it, whatever the GPUs, so a 0.35 h deadline is met by no 1-PS cluster
and by 4 on-demand A100s behind 2 PS (0.26 h). Seeded: the same figures on every run."""

from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.plan import make_plan
from orchestrator.simulate import planner
from orchestrator.simulate.models import SimModels
from orchestrator.simulate.planner import evaluate, parse_args, plan_experiment, rank
from orchestrator.simulate.planner_candidates import candidates, configure
from orchestrator.simulate.planner_misses import nearest_misses
from orchestrator.simulate.validate import compose

QUESTION = ["+experiment=cifar10_res32", "planner.zones=first", "planner.gpus=[a100]",
            "planner.workers=[4,8]", "planner.transient=[false]", "planner.repeats=20",
            "planner.max_repeats=40", "deadline_h=0.35"]


@pytest.fixture(autouse=True)
def empty_calibration_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No calibration of this machine or of a GPU unless a test records one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def question(*extra: str) -> object:
    return compose(parse_args([*QUESTION, *extra]))


def test_candidates_add_a_ps_only_where_the_workers_could_outrun_it() -> None:
    models = SimModels.load()
    cfg = question("planner.gpus=[a100,t4]", "planner.workers=[1,4]")
    # the first search: the experiment's own count only (one more only if nothing meets)
    assert {c.parameter_servers for c in candidates(cfg, models)} == {1}
    by: dict[tuple[str, int], list[int]] = {}
    for c in candidates(cfg, models, more_ps=True):
        by.setdefault((c.gpu, c.workers), []).append(c.parameter_servers)
    assert by[("a100", 4)] == [1, 2]  # 4 A100s outrun one PS: one more is tried
    assert by[("t4", 1)] == [1]  # one T4 never does: a second PS would only cost
    assert all(ps[0] == 1 for ps in by.values())  # each with the experiment's own count
    # BSP waits for the slowest worker, not the PS: no extra PS by default
    bsp = question("planner.bsp_fractions=[1]")
    assert {c.parameter_servers for c in candidates(bsp, models, more_ps=True)} == {1}
    # an explicit list: every count for every cluster, as typed
    asked = question("planner.gpus=[t4]", "planner.workers=[1]", "planner.parameter_servers=[1,3]")
    assert [c.parameter_servers for c in candidates(asked, models)] == [1, 3]
    # the experiment's own count is the default's first, one more the second
    own = question("cluster.parameter_servers=2", "planner.workers=[16]")
    assert [c.parameter_servers for c in candidates(own, models, more_ps=True)] == [2, 3]


def test_configure_plans_the_candidates_parameter_servers() -> None:
    cfg = question()
    two = next(c for c in candidates(cfg, SimModels.load(), more_ps=True)
               if c.parameter_servers == 2)
    assert two.label == "4× a100 on-demand, 2 PS"
    run_cfg = configure(cfg, two)
    assert run_cfg.cluster.parameter_servers == 2 and cfg.cluster.parameter_servers == 1
    plan = make_plan(run_cfg)
    assert [h.role for h in plan.hosts].count("ps") == 2


def test_a_second_ps_answers_what_one_cannot_and_its_dry_run_has_two(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one PS: nothing meets 0.35 h, and the answer says the PS capacity is why
    one = question("planner.parameter_servers=[1]")
    rows = evaluate(one)
    assert rows and rank(rows, one) == []
    lines = nearest_misses(rows, one).splitlines()
    assert lines[0] == ("nothing meets the limits: the parameter servers' capacity bounds every "
                        "configuration (1 PS serves 44.0 steps/s; the deadline needs ≥ 50.8 "
                        "steps/s, so ≥ 2 PS: planner.parameter_servers=[2])")
    # nearest by time: equal medians (both PS-capped), the cheaper first
    assert lines[1].startswith("closest by time: 4× a100 on-demand † in us-central1-a: 0.46 h "
                               "(median), P(deadline) 0%, mean $")
    assert lines[1].index("4× a100") < lines[1].index("8× a100")
    # the default tries a second PS where the workers outrun one: it meets the deadline
    ranked, out = plan_experiment(parse_args(QUESTION), out_dir=tmp_path / "plan")
    top = ranked[0]
    assert top["candidate"].parameter_servers == 2 and top["p_deadline"] >= 0.9
    printed = capsys.readouterr().out
    assert "4× a100 on-demand, 2 PS" in printed
    assert ("no configuration with cluster.parameter_servers=1 meets the limits: one PS more "
            "was tried") in printed
    with open(out / "plan.csv") as f:
        assert {r["parameter_servers"] for r in csv.DictReader(f)} == {"2"}
    line = next(x for x in printed.splitlines() if x.startswith("dry run of #1: "))
    words = shlex.split(line.removeprefix("dry run of #1: "))
    overrides = words[next(i for i, w in enumerate(words) if "=" in w):]
    assert "cluster.parameter_servers=2" in overrides
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *overrides], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: nothing provisioned" in proc.stdout and "4 workers, 2 PS" in proc.stdout


def test_a_deadline_below_the_fastest_or_met_too_rarely_is_named_as_such() -> None:
    # BSP: no PS cap, so the limit is the fastest row's own speed
    cfg = question("planner.bsp_fractions=[1]", "deadline_h=0.1")
    rows = evaluate(cfg)
    assert rank(rows, cfg) == []
    fastest = min(rows, key=lambda r: r["time_to_result_s"]["p50"])
    lines = nearest_misses(rows, cfg).splitlines()
    assert lines[0] == ("nothing meets the limits: the deadline is below the fastest possible: "
                        "the fastest configuration's median is "
                        f"{fastest['time_to_result_s']['p50'] / 3600:.2f} h "
                        f"({fastest['candidate'].label})")
    assert lines[1].startswith(f"closest by time: {fastest['candidate'].label} †")
    # a median under the deadline, but too few runs make it: the probability binds
    cfg = question("planner.gpus=[t4]", "planner.workers=[4]", "planner.transient=[true]",
                   "deadline_h=1")
    rows = evaluate(cfg)
    assert rank(rows, cfg) == [] and rows[0]["time_to_result_s"]["p50"] < 3600
    assert nearest_misses(rows, cfg).splitlines()[0] == (
        "nothing meets the limits: the deadline is met too rarely: at best P(deadline) "
        f"{rows[0]['p_deadline']:.0%} (4× t4 transient), under planner.min_p_deadline 90%")


def test_a_bad_ps_count_is_named_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        planner.main(["+experiment=cifar10_res32", "planner.parameter_servers=[1,0]"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "config error: planner.parameter_servers.1: must be ≥ 1 (got 0)")
