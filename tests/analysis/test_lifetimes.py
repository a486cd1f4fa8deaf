"""Revocation lifetimes reproduce CM-DARE's and ICAC'19's counts; models export and sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis import lifetimes


@pytest.fixture(scope="module")
def cmdare_summary():
    return lifetimes.summarize_lifetimes(lifetimes.load_lifetimes("cmdare")).set_index("gpu")


@pytest.mark.parametrize(("gpu", "pct"), [("K80", 46.2), ("P100", 54.2), ("V100", 57.5)])
def test_revoked_within_24h_exact(cmdare_summary, gpu: str, pct: float) -> None:
    row = cmdare_summary.loc[gpu]
    assert round(row["revoked_24h_pct"], 1) == pct
    assert row["km_revoked_24h_pct"] == pytest.approx(row["revoked_24h_pct"], abs=1e-9)


def test_first_hour_counts(cmdare_summary) -> None:
    # README: the first hour holds 46 % (K80), 29 % (P100), 55 % (V100) of revocations
    first = cmdare_summary["first_hour_of_revocations_pct"].round(0).to_dict()
    assert first == {"K80": 46.0, "P100": 29.0, "V100": 55.0}
    assert cmdare_summary.loc["K80", "vms"] == 156 and cmdare_summary.loc["K80", "revoked"] == 72


def test_icac19_counts() -> None:
    df = lifetimes.load_lifetimes("icac19")
    counts = df.groupby("gpu")["revoked"].agg(["size", "sum"]).to_dict("index")
    assert counts == {"K80": {"size": 64, "sum": 20}, "P100": {"size": 40, "sum": 8},
                      "V100": {"size": 48, "sum": 5}}
    assert (df["lifetime_hours"] > 0).all() and (df["lifetime_hours"] <= 24).all()


def test_weibull_infant_mortality(cmdare_summary) -> None:
    # shape < 1: hazard falls with age; Weibull fits better than exponential (lower AIC)
    assert (cmdare_summary["weibull_rho"] < 1).all()
    assert (cmdare_summary["weibull_aic"] < cmdare_summary["exp_aic"]).all()


def test_hazard_first_hour() -> None:
    df = lifetimes.load_lifetimes("cmdare")
    hz = lifetimes.hourly_hazard(df[df["gpu"] == "K80"])
    assert hz.loc[0, "at_risk"] == 156 and hz.loc[0, "revocations"] == 33
    assert hz["revocations"].sum() == 72


def test_export_and_sample(tmp_path: Path) -> None:
    path = lifetimes.export_revocation_models(tmp_path / "m.json")
    models = json.loads(path.read_text())
    assert set(models["gpus"]) == {"K80", "P100", "V100"}
    assert "us-west1" in models["gpus"]["K80"] and "all" in models["gpus"]["K80"]
    draws = lifetimes.sample_lifetimes(path, "K80", None, 200_000, np.random.default_rng(0))
    assert draws.max() <= 24.0 and draws.min() >= 0.0
    assert (draws < 24).mean() == pytest.approx(0.462, abs=0.005)  # reproduces the measured CDF
    assert (draws <= 1).mean() == pytest.approx(33 / 156, abs=0.005)
    for kind in ("weibull", "exponential"):
        d = lifetimes.sample_lifetimes(models, "p100", "us-east1-c", 1000, 1, kind=kind)
        assert d.shape == (1000,) and d.max() <= 24.0


def test_yaml_export_roundtrip(tmp_path: Path) -> None:
    path = lifetimes.export_revocation_models(tmp_path / "m.yaml")
    assert lifetimes.load_revocation_models(path)["cap_hours"] == 24.0


def test_shipped_models_file_matches_code() -> None:
    shipped = lifetimes.load_revocation_models(None)
    assert shipped == json.loads(json.dumps(lifetimes.build_revocation_models()))


def test_unknown_gpu_and_kind() -> None:
    with pytest.raises(KeyError, match="available: K80"):
        lifetimes.sample_lifetimes(None, "H100", None, 1)
    with pytest.raises(ValueError, match="unknown kind"):
        lifetimes.sample_lifetimes(None, "K80", None, 1, kind="gamma")
