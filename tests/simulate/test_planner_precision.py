"""The planner says what it knows to the precision it knows it (issue 37): probability bounds
from the number of runs, accuracy only where measured runs support it and with their source,
costs in the dry run to the estimate's error, borrowed lifetimes named, the samples each answer
trains, a reason instead of an empty table, and a dry-run command for its answer.

Small seeded questions (one zone, few GPUs and worker counts, 20 runs a row) keep these fast.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.validation import validate
from orchestrator.display import approx_usd, render_plan
from orchestrator.plan import make_plan, plan_phases, samples_trained
from orchestrator.simulate import planner
from orchestrator.simulate.band import predict_band, share_text, wilson_bounds, wilson_halfwidth
from orchestrator.simulate.planner import evaluate, parse_args, plan_experiment, rank
from orchestrator.simulate.planner_candidates import configure
from orchestrator.simulate.planner_report import (
    dry_run_command,
    print_table,
    samples_of,
    write_csv,
)
from orchestrator.simulate.validate import compose

SMALL = ["+experiment=cifar10_res32", "planner.zones=first", "planner.repeats=20",
         "planner.max_repeats=20"]


@pytest.fixture(autouse=True)
def empty_calibration_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No calibration of this machine or of a GPU unless a test records one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def question(*extra: str) -> object:
    return compose(parse_args([*SMALL, *extra]))


def table_text(rows: list[dict], cfg: object) -> str:
    console = Console(record=True, width=400)
    print_table(rows, cfg, len(rows), console)
    return console.export_text()


def test_every_run_is_said_as_its_wilson_bound_never_a_certainty() -> None:
    assert share_text(1.0, 200) == "≥ 98%"  # the example: 200 of 200 runs
    assert share_text(0.0, 200) == "≤ 2%"
    assert share_text(199 / 200, 200) == "99%"  # rounding would have said 100 %
    assert share_text(1.0, 20) == "≥ 83%"  # fewer runs, a weaker bound
    low, high = wilson_bounds(0.5, 100)
    assert low < 0.5 < high and high - low == pytest.approx(2 * wilson_halfwidth(0.5, 100))
    cfg = question("deadline_h=3", "planner.gpus=[p100]", "planner.workers=[4]",
                   "planner.transient=[false]", "planner.parameter_servers=[1]")
    rows = rank(evaluate(cfg), cfg)
    assert rows and rows[0]["p_deadline"] == 1.0 and rows[0]["runs"] == 20
    text = table_text(rows, cfg)
    assert "100%" not in text and text.count("≥ 83%") == 2  # P(deadline) and completes
    assert "said as the 95 % Wilson bound" in text
    # the dry run's band says it the same way
    dry = question("dry_run=true", "sim.repeats=20", "cluster.worker_groups.0.transient=false")
    plan = make_plan(dry)
    plan.prediction = predict_band(dry, plan)
    console = Console(record=True, width=400)
    render_plan(plan, console)
    assert "P(completes) ≥ 83%" in console.export_text()


def test_accuracy_is_shown_only_where_measured_with_its_source(tmp_path: Path) -> None:
    cfg = question("pricing=papers_2019", "planner.gpus=[k80,p100]", "planner.workers=[4]",
                   "planner.transient=[true]")
    rows = {r["gpu"]: r for r in evaluate(cfg)}
    k80, p100 = rows["k80"], rows["p100"]
    assert k80["accuracy_source"] == "ICAC'19 4 transient K80, 31 runs"
    assert p100["final_accuracy"] == k80["final_accuracy"]  # the simulation copies it...
    text = table_text([k80, p100], cfg)
    line = {r: next(x for x in text.splitlines() if f"4× {r} transient" in x)
            for r in ("k80", "p100")}
    assert line["k80"].rstrip(" │").endswith("0.912")  # 3 decimals, not 0.9123
    assert line["p100"].rstrip(" │").endswith("-")  # ...the table does not
    assert "accuracy: the mean final test accuracy of measured runs" in text
    assert "on K80, to 3 decimals: ICAC'19 4 transient K80, 31 runs" in text
    assert "accuracy -: no measured run supports it" in text
    assert "the same setup on K80: 0.912 (ICAC'19 4 transient K80, 31 runs)" in text
    write_csv([k80, p100], tmp_path / "plan.csv")
    with open(tmp_path / "plan.csv") as f:
        by_gpu = {r["gpu"]: r for r in csv.DictReader(f)}
    assert by_gpu["k80"]["accuracy_source"] == "ICAC'19 4 transient K80, 31 runs"
    assert by_gpu["p100"]["final_accuracy"] == "" and by_gpu["p100"]["accuracy_source"] == ""


def test_dry_run_costs_and_rates_are_rounded_to_the_estimates_error() -> None:
    assert approx_usd(0.500123) == "~$0.50"
    assert approx_usd(0.0001234) == "~$0.00012"
    assert approx_usd(1234.5) == "~$1,200"
    assert approx_usd(0.996) == "~$1.0"
    assert approx_usd(0.19, unit="") == "~0.19" and approx_usd(None) == "n/a"
    dry = question("dry_run=true", "sim.repeats=3")
    plan = make_plan(dry)
    plan.prediction = predict_band(dry, plan)
    console = Console(record=True, width=400)
    render_plan(plan, console)
    text = console.export_text()
    assert not re.search(r"\d\.\d{4}", text)  # no $0.0001 anywhere: rates, costs, totals
    assert re.search(r"cost: ~\$[\d.]+/h .* est\. cost: ~\$\d", text)
    assert re.search(r"simulated .* cost ~\$[\d.]+ – ~\$[\d.]+", text)


def test_lifetimes_borrowed_from_other_gpus_are_named() -> None:
    cfg = question("planner.gpus=[t4,p100]", "planner.workers=[4]")
    rows = {(r["gpu"], r["transient"]): r for r in evaluate(cfg)}
    text = table_text([rows["t4", True], rows["p100", True]], cfg)
    assert ("lifetimes: revocations drawn from CM-DARE's 2019–20 measured preemptible K80, P100, "
            "V100 VMs (396 VMs, sim.lifetimes=cmdare), applied to today's Spot VMs") in text
    assert "T4: nobody measured their lifetimes, borrowed from K80, P100, V100 pooled" in text
    assert "borrowed" not in table_text([rows["p100", True]], cfg)  # P100 was measured
    assert "lifetimes:" not in table_text([rows["t4", False]], cfg)  # nothing revokes it


def test_a_cpu_only_job_says_why_there_is_nothing_to_plan(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"job\.hparam_set: cnn_small: the speed model has "
                                          r"no GPU figure for this job"):
        plan_experiment(parse_args(["+experiment=digits_local"]))
    with pytest.raises(SystemExit) as exit_:
        planner.main(["+experiment=digits_local"])
    assert exit_.value.code == CONFIG_ERROR_EXIT_CODE
    out, err = capsys.readouterr()
    assert "configurations" not in out  # no empty table
    assert len(err.strip().splitlines()) == 1 and "CPU-only job" in err
    assert err.startswith("config error: job.hparam_set: ")
    # GPUs asked for that cannot be planned: each with its reason
    with pytest.raises(ConfigError) as info:
        plan_experiment(parse_args([*SMALL, "planner.gpus=[k80]"]))
    assert info.value.line().startswith(
        "config error: planner.gpus: no GPU to plan: k80: retired under pricing=gce (rentable, ")


def test_samples_trained_show_a_switch_schedules_unequal_work(tmp_path: Path) -> None:
    cfg = question("planner.gpus=[p100]", "planner.workers=[1,4]", "planner.transient=[false]",
                   "planner.bsp_fractions=[0.25]")
    rows = {r["workers"]: r for r in evaluate(cfg)}
    one, four = (samples_of(cfg, rows[n]) for n in (1, 4))
    budget, batch = cfg.job.train_steps, cfg.job.batch_size
    assert (one, four) == (budget * batch, 4 * budget * batch)  # B·N·batch
    text = table_text([rows[1], rows[4]], cfg)
    assert f"{one / 1e6:.3g}M" in text and f"{four / 1e6:.3g}M" in text
    assert "is in BSP-equivalent steps" in text and "fewer workers train fewer" in text
    # ASP as configured trains job.train_steps batches whatever the workers: no note needed
    asp = question("planner.gpus=[p100]", "planner.workers=[1,4]", "planner.transient=[false]")
    asp_rows = evaluate(asp)
    assert {samples_of(asp, r) for r in asp_rows} == {budget * batch}
    assert "BSP-equivalent" not in table_text(asp_rows, asp)
    run_cfg = configure(cfg, rows[4]["candidate"])
    assert samples_trained(batch, 4, plan_phases(run_cfg, 4)) == four
    for r in rows.values():
        r["samples"] = samples_of(cfg, r)
    write_csv(list(rows.values()), tmp_path / "plan.csv")
    with open(tmp_path / "plan.csv") as f:
        assert sorted(int(r["samples"]) for r in csv.DictReader(f)) == [one, four]


def test_the_printed_dry_run_command_makes_the_top_rows_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SMALL, "planner.gpus=[l4,t4]", "planner.workers=[4]",
            "planner.bsp_fractions=[0.25]", "pricing=gce"]
    ranked, _ = plan_experiment(parse_args(args), out_dir=tmp_path / "plan")
    top = ranked[0]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("dry run of #1: "))
    words = shlex.split(line.removeprefix("dry run of #1: "))
    overrides = words[next(i for i, w in enumerate(words) if "=" in w):]
    assert "pricing=gce" in overrides and "dry_run=true" in overrides
    assert not any(o.startswith("planner.") for o in overrides)
    # the dry run's own composition of those overrides passes validation and is the row's cluster
    cfg = compose(overrides)
    validate(cfg)
    plan = make_plan(cfg)
    workers = [h for h in plan.hosts if h.role == "worker"]
    group = configure(question(*args[len(SMALL):]), top["candidate"]).cluster.worker_groups[0]
    assert len(workers) == top["workers"] == 4
    assert {(h.gpu, h.zone, h.machine_type, h.transient) for h in workers} == {
        (top["gpu"], top["zone"], group.machine_type, top["transient"])}
    assert [(p.protocol, p.bsp_equivalent_steps) for p in plan.phases] == [
        ("bsp", 0.25 * cfg.job.train_steps), ("asp", 0.75 * cfg.job.train_steps)]
    # a question's own schedule is kept unless the row replaces it
    asked = ["+experiment=cifar10_res32", "sync=switch", "planner.workers=[4]"]
    own = {**top, "candidate": dataclasses.replace(top["candidate"], bsp_fraction=None)}
    assert "sync=switch" in dry_run_command(asked, cfg, own).split()
    assert "sync=switch" not in dry_run_command(asked, cfg, top).split()
    assert "planner.workers" not in dry_run_command(asked, cfg, own)
    # and the command itself, as the user runs it
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *overrides], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: nothing provisioned" in proc.stdout
    assert group.machine_type in proc.stdout and top["zone"] in proc.stdout


def test_a_gpu_whose_speed_nothing_supports_shows_no_figure_and_is_never_the_answer() -> None:
    """L4 on ResNet-32: no measurement, no public throughput, outside the measured GPUs'
    range (SimModels.supported). Its rows print no P, time or cost, rank after T4's, and the
    note gives the reason and the calibration that would replace the estimate."""
    cfg = question("planner.gpus=[l4,t4]", "planner.workers=[1]", "planner.transient=[true]")
    ranked = rank(evaluate(cfg), cfg)
    assert [r["gpu"] for r in ranked] == ["t4", "l4"]
    text = table_text(ranked, cfg)
    l4 = next(line for line in text.splitlines() if "1× l4 transient ‡" in line)
    cells = [c.strip() for c in l4.split("│")[1:-1]]
    assert cells[5:11] == ["‡", "‡", "—", "—", "—", "—"], cells  # P, completes, time, cost, revs
    assert "‡ l4: no figure shown: no measurement or public throughput of L4" in text
    assert "--gpu l4 --step-s SECONDS" in text
