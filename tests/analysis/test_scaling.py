"""Cluster-size scaling and PS-bottleneck detection against CM-DARE's figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import scaling


@pytest.fixture(scope="module")
def flags():
    return scaling.detect_ps_bottleneck().set_index(["gpu", "parameter_servers", "model"])


def test_p100_one_ps_saturates_near_45(flags) -> None:
    row = flags.loc[("P100", 1, "ResNet-32")]
    assert row["bottleneck"]
    assert row["saturation_workers"] == 5
    assert row["saturation_speed"] == pytest.approx(45, abs=1.5)


def test_two_ps_not_saturated_below_80(flags) -> None:
    row = flags.loc[("P100", 2, "ResNet-32")]
    assert not row["bottleneck"]
    assert row["max_speed"] == pytest.approx(80, abs=1.0)


def test_k80_scales_linearly(flags) -> None:
    assert not flags.loc["K80"]["bottleneck"].any()
    fits = {(f.gpu, f.parameter_servers, f.model): f for f in scaling.fit_scaling()}
    k80 = fits[("K80", 1, "ResNet-32")]
    assert np.isinf(k80.capacity) and k80.efficiency == pytest.approx(1.0, abs=0.02)
    assert fits[("P100", 1, "ResNet-32")].capacity == pytest.approx(44.8, abs=1.0)


def test_raw_exports_agree_with_plotted_means() -> None:
    raw = scaling.load_cluster_speeds()
    assert len(raw) == 96
    derived = scaling.load_derived_cluster_speeds()
    merged = derived.merge(raw, on=["gpu", "parameter_servers", "model", "workers"])
    assert np.median(np.abs(merged["speed_x"] / merged["speed_y"] - 1)) < 0.01
    row = scaling.detect_ps_bottleneck(raw).set_index(["gpu", "parameter_servers", "model"])
    assert row.loc[("P100", 1, "ResNet-32"), "bottleneck"]


def test_predict_cluster_speed_caps_at_ps_capacity() -> None:
    params = scaling.MODEL_PARAMS["ResNet-32"]
    one_ps = scaling.predict_cluster_speed(11.4, np.arange(1, 9), 1, params)
    two_ps = scaling.predict_cluster_speed(11.4, np.arange(1, 9), 2, params)
    assert one_ps[-1] == pytest.approx(45, rel=0.1) and one_ps[-1] == one_ps[-2]
    assert two_ps[-1] > 80
    assert scaling.predict_cluster_speed(4.5, 8)[()] == pytest.approx(36, rel=0.05)


def test_cli_json(capsys: pytest.CaptureFixture) -> None:
    assert scaling.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["fits"]) == 12 and len(out["bottlenecks"]) == 12
