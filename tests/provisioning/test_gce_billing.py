"""Today's GCE prices from the Cloud Billing Catalog API (provisioning/gce/billing.py), read
from the local stand-in tests/fakes/billing_server.py over the real REST protocol with
google-auth's own credentials and session."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.errors import ConfigError
from provisioning.catalog import GpuOffer, MachineOffer, PricingConfig, RegionPrice
from provisioning.gce.billing import (
    CACHE_TTL_S,
    LIVE_SOURCE,
    apply_rates,
    cache_path,
    live_pricing,
    rates_from_skus,
)
from tests.fakes.billing_server import FakeBilling, billing_server, realistic_skus

SHIPPED_DATE = "2026-11-28"  # conf/pricing/gce.yaml's date


def _catalog() -> PricingConfig:
    return PricingConfig(
        name="gce", date=SHIPPED_DATE, transient_market="spot",  # type: ignore[arg-type]
        gpus={"t4": GpuOffer(0.35, 0.14, zones=["europe-west1-b"],
                             regions={"europe-west1": RegionPrice(0.35, 0.14)}),
              "v100": GpuOffer(2.48, 0.992, zones=["us-central1-a"])},
        machine_types={"n1-standard-8": MachineOffer(0.38, 0.0963, 8, 30),
                       "e2-standard-2": MachineOffer(0.06701, 0.02679, 2, 8)})


def test_skus_map_to_per_gpu_and_per_machine_prices_by_region_and_market() -> None:
    live = apply_rates(_catalog(), rates_from_skus(realistic_skus()), "2026-11-29")
    # a T4 Spot SKU whose serviceRegions is europe-west1 prices a europe-west1-b T4
    assert live.hourly_price("e2-standard-2", "t4", True, zone="europe-west1-b") == \
        pytest.approx(0.0875 + 0.02679)
    assert live.gpus["t4"].on_demand_usd_per_h == 0.35  # not the Virtual Workstation's 0.55
    assert live.gpus["t4"].preemptible_usd_per_h == 0.1301
    # n1-standard-8 on demand in us-central1: 8 vCPUs x core + 30 GiB x RAM
    assert live.machine_types["n1-standard-8"].on_demand_usd_per_h == \
        pytest.approx(8 * 0.031611 + 30 * 0.004237)
    assert live.hourly_price("n1-standard-8", None, True, zone="europe-west1-b") == \
        pytest.approx(8 * 0.0071 + 30 * 0.00095)
    # no SKU read: the shipped figure stays (V100 GPU, E2 machine, the N1's us-central1 Spot)
    assert (live.gpus["v100"].on_demand_usd_per_h, live.gpus["v100"].preemptible_usd_per_h) \
        == (2.48, 0.992)
    assert live.machine_types["e2-standard-2"].on_demand_usd_per_h == 0.06701
    assert live.machine_types["n1-standard-8"].preemptible_usd_per_h == 0.0963
    assert (live.source, live.date) == (LIVE_SOURCE, "2026-11-29")


@pytest.fixture
def google_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBilling]:
    """The stand-in, with an ADC file whose tokens it issues; no gcloud config, no GCE probe."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    with billing_server() as fake:
        monkeypatch.setenv("TRANSIENT_BILLING_ENDPOINT", fake.endpoint)
        yield fake


def _header(*overrides: str) -> str:
    from orchestrator.simulate.planner import parse_args
    from orchestrator.simulate.planner_report import header
    from orchestrator.simulate.validate import compose

    return header(compose(parse_args(["+experiment=cifar10_res32", *overrides])), 0, 0)


def test_the_planner_prices_at_the_apis_figures_paged_and_cached(
        google_env: FakeBilling, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime

    from orchestrator.validate import compose_experiment

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(google_env.token_file(tmp_path)))
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert f"prices gce {today} from {LIVE_SOURCE})" in _header()
    pages = -(-len(google_env.skus) // google_env.page_size)
    assert google_env.calls == pages > 1  # every page followed
    assert cache_path(google_env.endpoint).is_file()
    cfg = compose_experiment("cifar10_res32")  # the cache answers: no request
    assert google_env.calls == pages
    assert cfg.pricing.gpus["t4"].regions["europe-west1"].preemptible_usd_per_h == 0.0875
    live_pricing(_catalog(), now=time.time() + 2 * CACHE_TTL_S)  # a day on: read again
    assert google_env.calls == 2 * pages


def test_without_credentials_the_shipped_catalogue_and_its_date(
        google_env: FakeBilling, caplog: pytest.LogCaptureFixture) -> None:
    assert f"prices gce {SHIPPED_DATE})" in _header()
    assert google_env.calls == 0 and not caplog.records
    with caplog.at_level(logging.WARNING):  # live=true asks google.auth anyway: one line why
        assert f"prices gce {SHIPPED_DATE})" in _header("pricing.live=true")
    assert [r.getMessage().count("\n") for r in caplog.records] == [0]
    assert "no Google credentials" in caplog.records[0].getMessage()


def test_a_403_is_one_warning_and_the_shipped_prices(
        google_env: FakeBilling, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.validate import compose_experiment

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(google_env.token_file(tmp_path)))
    google_env.deny = True
    with caplog.at_level(logging.WARNING):
        cfg = compose_experiment("cifar10_res32")
    assert (cfg.pricing.source != LIVE_SOURCE, cfg.pricing.date) == (True, SHIPPED_DATE)
    assert cfg.pricing.gpus["t4"].regions["europe-west1"].preemptible_usd_per_h == 0.14
    assert len(caplog.records) == 1 and "403" in caplog.records[0].getMessage()
    assert "\n" not in caplog.records[0].getMessage()
    # remembered for an hour: the next command asks nothing and says nothing again
    calls = google_env.calls
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cfg = compose_experiment("cifar10_res32")
    assert cfg.pricing.date == SHIPPED_DATE and google_env.calls == calls and not caplog.records


def test_pricing_live_off_reads_nothing_and_a_bad_value_names_the_field(
        google_env: FakeBilling, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.validate import compose_experiment

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(google_env.token_file(tmp_path)))
    assert compose_experiment("cifar10_res32", ["pricing.live=false"]).pricing.date == \
        SHIPPED_DATE
    assert google_env.calls == 0
    with pytest.raises(ConfigError, match=r"pricing\.live"):
        compose_experiment("cifar10_res32", ["pricing.live=sometimes"])
