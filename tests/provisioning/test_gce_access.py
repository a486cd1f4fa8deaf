"""Who logs in and who deletes (audit S4, D1), against the fake Compute API through the real
clients: with a user's own credentials (gcloud ADC, no e-mail in them) the OS Login account
comes from the token-info endpoint; an organisation policy that turns OS Login on shows only
in a VM's effective metadata, which the acquire follows before any login; 2-step OS Login is
refused before any VM; the VMs' service account must exist and, with a lease, be allowed to
delete its VM (the project's IAM policy), else one line naming provider.service_account and
provider.lease_s before any VM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.oauth2 import credentials as user_credentials

from provisioning.gce.api import ComputeApi
from provisioning.gce.preflight import PreflightError
from provisioning.gce.provider import GceProvider
from provisioning.journal import Journal
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    PROJECT,
    fake_fixture,
    gce_config,
    make_provider_fixture,
    small_request,
)

CLOUD = "https://www.googleapis.com/auth/cloud-platform"
EMAIL = "https://www.googleapis.com/auth/userinfo.email"
DEFAULT_SA = "1234-compute@developer.gserviceaccount.com"


def user_adc_provider(fake: FakeGce, tmp_path: Path, token_scopes: str, **overrides: Any
                      ) -> GceProvider:
    """A provider whose API calls carry a user's ADC (`authorized_user`: a refresh token, no
    e-mail), as `gcloud auth application-default login` leaves them; its current access token
    was issued for `token_scopes`, and refreshing goes to the fake's token endpoint."""
    fake.oauth_users["1//alice-refresh"] = "alice@example.com"
    fake.token_info["ya29.current"] = {"scope": token_scopes, "expires_in": "3000",
                                       **({"email": "alice@example.com"}
                                          if EMAIL in token_scopes.split() else {})}
    creds = user_credentials.Credentials(
        "ya29.current", refresh_token="1//alice-refresh", token_uri=f"{fake.endpoint}/token",
        client_id="client", client_secret="secret", scopes=[CLOUD])
    cfg = gce_config(fake, tmp_path, credentials="adc", **overrides)
    return GceProvider(cfg, journal=Journal(tmp_path / "journal.jsonl"),
                       api=ComputeApi(cfg, credentials=creds, project=PROJECT))


@pytest.mark.parametrize("token_scopes", [f"{CLOUD} {EMAIL}", CLOUD])
def test_user_credentials_log_in_through_os_login_without_a_user_setting(
        fake: FakeGce, tmp_path: Path, token_scopes: str) -> None:
    """The e-mail comes from token info: at once when the token carries the e-mail scope, else
    from a token refreshed for that scope alone (ADC tokens are refreshed for the run's scopes
    only); OS Login then names the POSIX user."""
    fake.project_metadata["enable-oslogin"] = "TRUE"
    provider = user_adc_provider(fake, tmp_path, token_scopes)
    cluster = provider.acquire(small_request("adc", tmp_path, workers=1))
    try:
        assert fake.oslogin_keys == {"alice@example.com": [provider._public_key()]}
        assert provider.vm_of(cluster.hosts[0].id).ssh.user == "alice_example_com"
        refreshed = EMAIL not in token_scopes.split()
        assert fake.calls["oauth.token"] == int(refreshed)
        assert fake.calls["oauth.tokeninfo"] == 1 + int(refreshed)
    finally:
        provider.release(cluster)
    assert fake.live_instances() == []


def test_os_login_user_overrides_the_credentials_account(fake: FakeGce,
                                                         tmp_path: Path) -> None:
    fake.project_metadata["enable-oslogin"] = "TRUE"
    provider = user_adc_provider(fake, tmp_path, CLOUD, os_login_user="ops@example.com")
    cluster = provider.acquire(small_request("adc-o", tmp_path, workers=1))
    try:
        assert list(fake.oslogin_keys) == ["ops@example.com"]
        assert fake.calls["oauth.tokeninfo"] == 0
    finally:
        provider.release(cluster)


def test_os_login_turned_on_by_an_organisation_policy_is_followed_before_any_login(
        fake: FakeGce, tmp_path: Path) -> None:
    """The project's metadata says nothing; the first VM's effective metadata says OS Login
    is on: the key goes into the OS Login profile and SSH uses the POSIX user, not ssh-keys."""
    fake.oslogin_enforced = True
    provider = user_adc_provider(fake, tmp_path, f"{CLOUD} {EMAIL}")
    cluster = provider.acquire(small_request("org", tmp_path, workers=1))
    try:
        assert provider.os_login
        assert list(fake.oslogin_keys) == ["alice@example.com"]
        assert {provider.vm_of(h.id).ssh.user for h in cluster.hosts} == {"alice_example_com"}
        assert fake.calls["instances.get"] == 1  # one VM's effective value, not every VM's
    finally:
        provider.release(cluster)


def test_an_enforced_os_login_that_cannot_work_deletes_the_vms_and_says_why(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.oslogin_enforced = True
    provider = make_provider()  # anonymous credentials: no account to import the key for
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("org-no", tmp_path, workers=1))
    [line] = info.value.problems
    assert line.startswith("provider.os_login_user: project test-project has OS Login on "
                           "(an organisation policy, not its metadata)")
    assert fake.calls["instances.insert"] == 2 and fake.live_instances() == []


def test_two_step_os_login_is_refused(fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """Before any VM when the project turns OS Login on; after the first VM (which is then
    deleted) when only an organisation policy does."""
    fake.project_metadata.update({"enable-oslogin": "TRUE", "enable-oslogin-2fa": "TRUE"})
    provider = make_provider(os_login_user="alice@example.com")
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("2fa", tmp_path, workers=1))
    problems = info.value.problems
    assert [p for p in problems if p.startswith(
        "provider.project: project test-project has OS Login with 2-step verification")]
    assert fake.calls["instances.insert"] == 0

    del fake.project_metadata["enable-oslogin"]
    fake.oslogin_enforced = True
    provider = make_provider(os_login_user="alice@example.com")
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("2fa-org", tmp_path, workers=1))
    assert "2-step verification" in info.value.problems[0]
    assert fake.live_instances() == []


def test_a_deleted_default_service_account_is_one_line_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    del fake.service_accounts[DEFAULT_SA]
    provider = make_provider()
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("nosa", tmp_path, workers=1))
    [line] = info.value.problems
    assert line.startswith(f"provider.service_account: {DEFAULT_SA}, the default compute "
                           "account (provider.service_account: null), does not exist")
    assert "provider.lease_s=0" in line and "\n" not in line
    assert fake.calls["instances.insert"] == 0
    # Without a lease the VMs get no account, so none is needed (nor asked about).
    calls = fake.calls["iam.serviceAccounts.get"]
    cluster = make_provider(lease_s=0).acquire(small_request("nolease", tmp_path, workers=1))
    assert fake.calls["iam.serviceAccounts.get"] == calls
    assert len(fake.live_instances()) == 2 and cluster.hosts


def test_a_vm_account_without_a_role_that_deletes_is_one_line_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """A new organisation: the default account has no role, so the lease watcher could only
    power its VM off."""
    fake.iam_policy = {"roles/compute.viewer": [f"serviceAccount:{DEFAULT_SA}"]}
    provider = make_provider()
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("norole", tmp_path, workers=1))
    [line] = info.value.problems
    assert line.startswith(f"provider.service_account: {DEFAULT_SA} has no role on project "
                           "test-project that allows compute.instances.delete")
    assert "roles/compute.instanceAdmin.v1" in line and line.endswith("provider.lease_s=0")
    assert fake.calls["instances.insert"] == 0
    assert fake.calls["iam.roles.get"] == 1  # compute.viewer asked; known roles are not


def test_a_custom_role_with_the_delete_permission_lets_the_lease_work(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    mine = "lease@test-project.iam.gserviceaccount.com"
    fake.service_accounts[mine] = {"disabled": False}
    fake.roles["projects/test-project/roles/leaseOnly"] = ["compute.instances.delete"]
    fake.iam_policy = {"projects/test-project/roles/leaseOnly": [f"serviceAccount:{mine}"]}
    cluster = make_provider(service_account=mine).acquire(
        small_request("custom", tmp_path, workers=1))
    assert cluster.hosts and len(fake.live_instances()) == 2
    assert all(i.body["serviceAccounts"][0]["email"] == mine for i in fake.live_instances())


def test_the_dry_run_says_what_it_could_not_check(fake: FakeGce, tmp_path: Path) -> None:
    """A caller who may not read the project's IAM policy: the roles are not checked (never
    refused), and the dry run says so."""
    fake.iam_policy_denied = True
    hosts = small_request("dry", tmp_path).hosts
    notes = GceProvider.preview(hosts, gce_config(fake, tmp_path)).notes
    [line] = [n for n in notes if DEFAULT_SA in n]
    assert line.startswith(f"ok: service account {DEFAULT_SA} exists; its roles not checked "
                           "(cannot read the project's IAM policy")
    assert not [n for n in notes if n.startswith("problem:")]
