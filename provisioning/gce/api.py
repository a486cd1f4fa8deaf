"""Thin, bounded access to the Compute Engine API through `google.cloud.compute_v1` (REST).

Every call is retried a bounded number of times with doubling backoff when it fails
transiently (the client library's own retries are off: by default it retries UNAVAILABLE for up
to 600 s, which froze a poll for 10 minutes when the orchestrator's link was cut), and every
error is classified once (`provisioning.gce.errors`). Operations are
waited on with our own `ZoneOperationsClient` in a bounded loop: `wait` returns when the
operation is DONE *or* after up to two minutes (sometimes earlier), and `ExtendedOperation.result()`
polls through a client built without our `api_endpoint` (platform-notes §6), so neither is used.

Google libraries are imported here, lazily: `provider=local` never loads this module.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from provisioning.base import BadFieldError, BadRequestError, ProvisionError
from provisioning.gce.config import CREDENTIALS_ADC, CREDENTIALS_ANONYMOUS, GceConfig
from provisioning.gce.errors import (
    GuestAttributesOffError,
    TransientApiError,
    classify,
    classify_exception,
    items_from_operation,
)
from provisioning.gce.firewall import EffectiveFirewalls, FirewallRule

T = TypeVar("T")
PROJECT_ENV = "GOOGLE_CLOUD_PROJECT"
#: How to authenticate, said once wherever credentials are missing.
AUTH_HINT = ("run `gcloud auth application-default login` (or set provider.credentials to a "
             "service-account key file) and provider.project, or run locally with provider=local")
#: Timeout of one HTTP request (a `wait` call returns within about 2 minutes by itself).
REQUEST_TIMEOUT_S = 150.0
#: google-auth's token-info endpoint (`google.oauth2.credentials`): whose an access token is;
#: the e-mail only when the token carries the e-mail scope.
TOKENINFO_URL = "https://oauth2.googleapis.com/tokeninfo"
EMAIL_SCOPE = "https://www.googleapis.com/auth/userinfo.email"
IAM_URL = "https://iam.googleapis.com"
CRM_URL = "https://cloudresourcemanager.googleapis.com"  # projects' IAM policies


class GceAuthError(BadFieldError):
    """No usable credentials or project: `field` is the config key to fix, the message says how
    to authenticate."""


def resolve_credentials(cfg: GceConfig) -> tuple[Any, str]:
    """(credentials, project) for `cfg`, or GceAuthError with one line saying what to do."""
    import google.auth
    from google.auth import exceptions as auth_exceptions
    from google.auth.credentials import AnonymousCredentials

    project = cfg.project or os.environ.get(PROJECT_ENV)
    if cfg.credentials == CREDENTIALS_ANONYMOUS:
        if not cfg.api_endpoint:
            raise GceAuthError("provider.credentials", "'anonymous' only works with "
                               "provider.api_endpoint (a local fake); " + AUTH_HINT)
        credentials: Any = AnonymousCredentials()
    elif cfg.credentials == CREDENTIALS_ADC:
        if not _adc_may_exist():  # fail at once instead of probing a metadata server for ~20 s
            raise GceAuthError("provider.credentials", "no Google credentials found; "
                               + AUTH_HINT)
        try:
            credentials, adc_project = google.auth.default(scopes=list(cfg.scopes))
        except auth_exceptions.DefaultCredentialsError:
            raise GceAuthError("provider.credentials", "no Google credentials found; "
                               + AUTH_HINT) from None
        project = project or adc_project
    else:
        from google.oauth2 import service_account

        path = os.path.expanduser(cfg.credentials)
        try:
            credentials = service_account.Credentials.from_service_account_file(
                path, scopes=list(cfg.scopes))
            project = project or json.loads(Path(path).read_text()).get("project_id")
        except (OSError, ValueError) as error:
            raise GceAuthError("provider.credentials", f"cannot read service-account key "
                               f"'{cfg.credentials}' ({error}); " + AUTH_HINT) from None
    if not project:
        raise GceAuthError("provider.project", f"no project set (set provider.project or "
                           f"${PROJECT_ENV}); " + AUTH_HINT)
    return credentials, project


def _adc_may_exist() -> bool:
    """Whether Application Default Credentials can be found without a network probe: the env
    variable, gcloud's ADC file, or this machine being a GCE VM (its metadata server)."""
    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    try:
        from google.auth import _cloud_sdk
        from google.auth.compute_engine import _metadata

        return (Path(_cloud_sdk.get_application_default_credentials_path()).is_file()
                or _metadata.detect_gce_residency_linux())
    except (ImportError, AttributeError):  # another google-auth layout: let default() decide
        return True


@dataclass(frozen=True)
class ListedVm:
    """What one `list` tells about a VM."""

    name: str
    zone: str
    status: str  # raw GCE status
    labels: dict[str, str]
    internal_ip: str
    external_ip: str


@dataclass(frozen=True)
class ProjectInfo:
    """What projects.get tells before anything is created."""

    quotas: dict[str, tuple[float, float]]  # metric -> (limit, usage), project-wide
    metadata: dict[str, str]  # commonInstanceMetadata (enable-oslogin, ...)
    default_service_account: str = ""  # the project's default compute service account


@dataclass(frozen=True)
class ImageInfo:
    """What images.get / getFromFamily / list tell about one image."""

    name: str
    family: str
    disk_gb: int  # the image's size: a boot disk made from it is at least this large
    created: str  # creationTimestamp (RFC 3339)
    deprecated: bool  # deprecated.state is DEPRECATED, OBSOLETE or DELETED


def _image_info(image: Any) -> ImageInfo:
    state = str(image.deprecated.state or "")
    return ImageInfo(str(image.name), str(image.family), int(image.disk_size_gb or 0),
                     str(image.creation_timestamp),
                     state in ("DEPRECATED", "OBSOLETE", "DELETED"))


def not_ready(error: BaseException) -> bool:
    """GCE's "the resource is not ready" (a VM still stopping, an address still held)."""
    text = str(error)
    return "RESOURCE_NOT_READY" in text or "resourceNotReady" in text or "is not ready" in text


def _quotas(quotas: Any) -> dict[str, tuple[float, float]]:
    return {str(q.metric): (float(q.limit), float(q.usage)) for q in quotas}


class ComputeApi:
    """The calls the backend makes, each bounded and classified."""

    def __init__(self, cfg: GceConfig, credentials: Any = None, project: str | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        if credentials is None or project is None:
            credentials, project = resolve_credentials(cfg)
        self.cfg = cfg
        self.project = project
        self._compute = compute_v1
        self._sleep = sleep
        options = ClientOptions(api_endpoint=cfg.api_endpoint) if cfg.api_endpoint else None
        self.instances = compute_v1.InstancesClient(
            credentials=credentials, client_options=options, transport="rest")
        self.zone_operations = compute_v1.ZoneOperationsClient(
            credentials=credentials, client_options=options, transport="rest")
        self._credentials, self._options = credentials, options
        self._more: dict[str, Any] = {}  # clients used once per run (projects, images, ...),
        #: and "email": `account_email`'s answer

    def _client(self, kind: str) -> Any:
        """`compute_v1.<kind>` built on first use with the same credentials and endpoint."""
        if kind not in self._more:
            self._more[kind] = getattr(self._compute, kind)(
                credentials=self._credentials, client_options=self._options, transport="rest")
        return self._more[kind]

    # --- retries ---------------------------------------------------------------------------

    def call(self, zone: str, fn: Callable[[], T], retries: int | None = None) -> T:
        """`fn()` with up to `retries` (default `cfg.retries`) retries of transient errors;
        others raise classified."""
        backoff = self.cfg.retry_backoff_s
        retries = self.cfg.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                return fn()
            except Exception as error:
                classified = classify_exception(zone, error)
                if not isinstance(classified, TransientApiError) or attempt == retries:
                    raise classified from error
            self._sleep(backoff)
            backoff *= 2
        raise AssertionError("unreachable")

    # --- instances -------------------------------------------------------------------------

    def insert(self, zone: str, body: dict[str, Any], request_id: str) -> str:
        """Start creating a VM; returns the operation name. The same `request_id` on a retry
        makes GCE return the first operation instead of creating a second VM."""
        resource = self._compute.Instance.from_json(json.dumps(body))
        request = self._compute.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=resource, request_id=request_id)
        op = self.call(zone, lambda: self.instances.insert(request=request,
                                                           timeout=REQUEST_TIMEOUT_S, retry=None))
        return op.name

    def delete(self, zone: str, name: str) -> str | None:
        """Start deleting a VM; the operation name, or None when it no longer exists."""
        from google.api_core import exceptions as gexc

        request = self._compute.DeleteInstanceRequest(
            project=self.project, zone=zone, instance=name, request_id=str(uuid.uuid4()))
        try:
            op = self.call(zone, lambda: self.instances.delete(request=request,
                                                               timeout=REQUEST_TIMEOUT_S, retry=None))
        except ProvisionError as error:
            if isinstance(error.__cause__, gexc.NotFound):
                return None
            raise
        return op.name

    def remove(self, zone: str, name: str, timeout_s: float) -> None:
        """Delete a VM and wait until it is gone (already gone is fine). A VM that GCE is
        itself stopping (a preemption) answers RESOURCE_NOT_READY for a while: retried with
        backoff for up to `cfg.not_ready_retry_s` instead of failing (SkyPilot does the same)."""
        deadline = time.monotonic() + self.cfg.not_ready_retry_s
        delay = self.cfg.retry_backoff_s
        while True:
            try:
                op = self.delete(zone, name)
                if op is not None:
                    self.wait(zone, op, timeout_s)
                return
            except ProvisionError as error:
                if not not_ready(error) or time.monotonic() + delay > deadline:
                    raise
            self._sleep(delay)
            delay = min(delay * 2, 15.0)

    def wait(self, zone: str, operation: str, timeout_s: float) -> None:
        """Block until the zone operation is DONE; raise its error classified. Bounded by
        `timeout_s` (TransientApiError after it)."""
        deadline = time.monotonic() + timeout_s
        done = self._compute.Operation.Status.DONE
        while True:
            op = self.call(zone, lambda: self.zone_operations.wait(
                project=self.project, zone=zone, operation=operation,
                timeout=REQUEST_TIMEOUT_S, retry=None))
            if op.status == done:
                break
            if time.monotonic() >= deadline:
                raise TransientApiError(f"{zone}: operation {operation} not done after "
                                        f"{timeout_s:g} s")
        if op.error.errors:
            raise classify(zone, op.http_error_status_code or None, items_from_operation(op))

    def list_vms(self, label_filter: str, retries: int | None = None,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> list[ListedVm]:
        """Every VM matching `label_filter` in every zone: ONE aggregatedList call (per page)."""
        request = self._compute.AggregatedListInstancesRequest(
            project=self.project, filter=label_filter)

        def fetch() -> list[ListedVm]:
            found = []
            for scope, scoped in self.instances.aggregated_list(request=request,
                                                                timeout=timeout_s, retry=None):
                zone = scope.rsplit("/", 1)[-1]
                for inst in scoped.instances:
                    nic = inst.network_interfaces[0] if inst.network_interfaces else None
                    internal = nic.network_i_p if nic else ""
                    external = (nic.access_configs[0].nat_i_p
                                if nic and nic.access_configs else "") or internal
                    found.append(ListedVm(inst.name, zone, inst.status, dict(inst.labels),
                                          internal, external))
            return found

        return self.call("all zones", fetch, retries)

    def host_keys(self, zone: str, name: str) -> list[tuple[str, str]] | None:
        """The host keys the guest agent published (`hostkeys/` guest attributes), or None when
        not published (yet) or guest attributes are off."""
        return self.guest_attributes(zone, name, "hostkeys")

    def guest_attributes(self, zone: str, name: str, namespace: str
                         ) -> list[tuple[str, str]] | None:
        """(key, value) of the guest attributes under `namespace/`, or None when none are
        published (yet) or guest attributes are off."""
        from google.api_core import exceptions as gexc

        request = self._compute.GetGuestAttributesInstanceRequest(
            project=self.project, zone=zone, instance=name, query_path=f"{namespace}/")
        try:
            attrs = self.call(zone, lambda: self.instances.get_guest_attributes(
                request=request, timeout=REQUEST_TIMEOUT_S, retry=None))
        except ProvisionError as error:
            if isinstance(error.__cause__, gexc.NotFound | gexc.BadRequest):
                return None
            if isinstance(error, BadRequestError) and \
                    isinstance(error.__cause__, gexc.Forbidden | gexc.PreconditionFailed):
                raise GuestAttributesOffError(f"guest attributes of VM {name} cannot be read "
                                              f"({' '.join(str(error).split())})") from error
            raise
        return [(item.key, item.value) for item in attrs.query_value.items] or None

    def set_metadata_value(self, zone: str, name: str, key: str, value: str) -> None:
        """Set one instance metadata item (instances.get for the fingerprint, then
        setMetadata; a fingerprint race is retried once)."""
        for attempt in range(2):
            inst = self.call(zone, lambda: self.instances.get(
                project=self.project, zone=zone, instance=name, timeout=REQUEST_TIMEOUT_S, retry=None))
            items = [self._compute.Items(key=i.key, value=i.value)
                     for i in inst.metadata.items if i.key != key]
            items.append(self._compute.Items(key=key, value=value))
            resource = self._compute.Metadata(fingerprint=inst.metadata.fingerprint, items=items)
            try:
                self.call(zone, lambda m=resource: self.instances.set_metadata(
                    project=self.project, zone=zone, instance=name,
                    metadata_resource=m, timeout=REQUEST_TIMEOUT_S, retry=None))
                return
            except BadRequestError:
                if attempt:
                    raise

    # --- the project, before anything is created (preflight.py) -------------------------

    def project_info(self) -> ProjectInfo:
        """The project's global quotas and common instance metadata (one projects.get)."""
        project = self.call("project", lambda: self._client("ProjectsClient").get(
            project=self.project, timeout=REQUEST_TIMEOUT_S, retry=None))
        metadata = {item.key: item.value for item in project.common_instance_metadata.items}
        default_account = (str(project.default_service_account)
                           or f"{project.id}-compute@developer.gserviceaccount.com")
        return ProjectInfo(_quotas(project.quotas), metadata, default_account)

    def region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of one region (one regions.get)."""
        found = self.call(region, lambda: self._client("RegionsClient").get(
            project=self.project, region=region, timeout=REQUEST_TIMEOUT_S, retry=None))
        return _quotas(found.quotas)

    def image_from_family(self, image_project: str, family: str) -> ImageInfo:
        """The image a family resolves to now: its newest image that is not deprecated
        (BadRequestError when there is none: the family does not exist or was retired)."""
        from google.api_core import exceptions as gexc

        try:
            image = self.call("images", lambda: self._client("ImagesClient").get_from_family(
                project=image_project, family=family, timeout=REQUEST_TIMEOUT_S, retry=None))
        except ProvisionError as error:
            if isinstance(error.__cause__, gexc.NotFound | gexc.Forbidden):
                raise BadRequestError(f"image family {family} not found in project "
                                      f"{image_project}") from None
            raise
        return _image_info(image)

    def effective_firewalls(self, project: str, network: str) -> EffectiveFirewalls:
        """The VPC firewall rules in force on `network` of `project` (one
        networks.getEffectiveFirewalls), and how many firewall policies also apply."""
        found = self.call("firewall", lambda: self._client("NetworksClient")
                          .get_effective_firewalls(project=project, network=network,
                                                   timeout=REQUEST_TIMEOUT_S, retry=None))
        rules = [FirewallRule(
            name=str(r.name), direction=str(r.direction or "INGRESS"),
            priority=int(r.priority) if "priority" in r else 1000, disabled=bool(r.disabled),
            source_ranges=tuple(r.source_ranges), source_tags=tuple(r.source_tags),
            source_service_accounts=tuple(r.source_service_accounts),
            target_tags=tuple(r.target_tags),
            target_service_accounts=tuple(r.target_service_accounts),
            allowed=tuple((str(a.I_p_protocol), tuple(a.ports)) for a in r.allowed),
            denied=tuple((str(d.I_p_protocol), tuple(d.ports)) for d in r.denied))
            for r in found.firewalls]
        policies = sum(1 for policy in found.firewall_policys if len(policy.rules))
        return EffectiveFirewalls(rules, policies)

    def list_images(self, image_project: str, filter_: str) -> list[ImageInfo]:
        """The images of `image_project` matching `filter_` (deprecated ones included), every
        page."""
        request = self._compute.ListImagesRequest(project=image_project, filter=filter_)
        return self.call("images", lambda: [_image_info(i) for i in self._client(
            "ImagesClient").list(request=request, timeout=REQUEST_TIMEOUT_S, retry=None)])

    def os_login_user(self) -> str | None:
        """Whose OS Login profile gets the key: `provider.os_login_user` (an override), else
        the account the credentials act for (`account_email`)."""
        return self.cfg.os_login_user or self.account_email()

    def account_email(self) -> str | None:
        """The e-mail of the account the credentials act for, so OS Login needs no setting: a
        service account's from the credentials; a user's (`gcloud auth application-default
        login` credentials carry none) from the token-info endpoint, asked again with a token
        for the e-mail scope alone when the run's token lacks it (ADC tokens are refreshed for
        `provider.scopes` only). None: anonymous credentials, or no e-mail to be had."""
        from google.auth.credentials import AnonymousCredentials
        from google.oauth2 import credentials as user_credentials

        if "email" in self._more:
            return self._more["email"]
        creds = self._credentials
        email = None
        if not isinstance(creds, AnonymousCredentials):
            email = self._service_account_email(creds) or self._token_email(creds)
            if email is None and isinstance(creds, user_credentials.Credentials) \
                    and creds.refresh_token:
                email = self._token_email(user_credentials.Credentials(
                    None, refresh_token=creds.refresh_token, token_uri=creds.token_uri,
                    client_id=creds.client_id, client_secret=creds.client_secret,
                    scopes=[EMAIL_SCOPE], quota_project_id=creds.quota_project_id))
        self._more["email"] = email
        return email

    def _service_account_email(self, creds: Any) -> str | None:
        email = getattr(creds, "service_account_email", None)
        if not (isinstance(email, str) and "@" in email) and hasattr(
                creds, "service_account_email") and not creds.valid:
            self._refresh(creds)  # a GCE VM's credentials learn their e-mail on refresh
            email = creds.service_account_email
        return email if isinstance(email, str) and "@" in email else None

    def _refresh(self, creds: Any) -> None:
        from google.auth import exceptions as auth_exceptions
        from google.auth.transport.requests import Request

        try:
            creds.refresh(Request())
        except auth_exceptions.GoogleAuthError as error:
            raise GceAuthError("provider.credentials", f"cannot refresh the credentials "
                               f"({error}); " + AUTH_HINT) from None

    def _token_email(self, creds: Any) -> str | None:
        """The e-mail token-info gives for `creds`' access token (refreshed first if stale)."""
        if not creds.valid:
            self._refresh(creds)
        if not creds.token:
            return None
        info = self._google_http("token info", "POST", self._google_url(TOKENINFO_URL,
                                                                           "/tokeninfo"),
                                 form={"access_token": creds.token}, auth=False)
        email = info.get("email")
        return str(email) if email else None

    def _google_url(self, root: str, path: str) -> str:
        """`root` + `path`, or `provider.api_endpoint` + `path` when set: a local fake serves
        every Google API the backend calls (as for OS Login)."""
        return (self.cfg.api_endpoint or root).rstrip("/") + path

    def _google_http(self, what: str, method: str, url: str, body: dict[str, Any] | None = None,
                     form: dict[str, str] | None = None, auth: bool = True) -> dict[str, Any]:
        """One JSON call to a Google REST API without a client library here (token info,
        IAM, Resource Manager), retried and classified like every Compute call."""
        import requests
        from google.api_core import exceptions as gexc
        from google.auth.transport.requests import AuthorizedSession

        def fetch() -> dict[str, Any]:
            with (AuthorizedSession(self._credentials) if auth else requests.Session()) as http:
                response = http.request(method, url, json=body, data=form,
                                        timeout=REQUEST_TIMEOUT_S)
            if response.status_code >= 400:
                raise gexc.from_http_response(response)
            return dict(response.json() or {})

        return self.call(what, fetch)

    def effective_os_login(self, zone: str, name: str) -> bool | None:
        """Whether OS Login is on for this VM, as GCE resolved it from instance and project
        metadata and organisation policy (`resourceStatus.effectiveInstanceMetadata`); None
        when GCE does not say."""
        inst = self.call(zone, lambda: self.instances.get(
            project=self.project, zone=zone, instance=name, timeout=REQUEST_TIMEOUT_S,
            retry=None))
        effective = inst.resource_status.effective_instance_metadata
        if "enable_oslogin_metadata_value" not in effective:
            return None
        return bool(effective.enable_oslogin_metadata_value)

    def service_account_exists(self, email: str) -> bool:
        """Whether the service account exists and is enabled (IAM serviceAccounts.get); a
        ProvisionError when it cannot be read (403: the caller may not see it)."""
        from google.api_core import exceptions as gexc

        url = self._google_url(IAM_URL, f"/v1/projects/-/serviceAccounts/{email}")
        try:
            found = self._google_http("IAM", "GET", url)
        except ProvisionError as error:
            if isinstance(error.__cause__, gexc.NotFound):
                return False
            raise
        return not found.get("disabled", False)

    def project_roles(self, member: str) -> list[tuple[str, bool]]:
        """(role, conditional) of every binding of the project's own IAM policy that names
        `member` (`serviceAccount:E`); roles granted on a folder or the organisation are not
        in it (Resource Manager projects.getIamPolicy)."""
        url = self._google_url(CRM_URL, f"/v1/projects/{self.project}:getIamPolicy")
        policy = self._google_http("IAM policy", "POST", url,
                                   body={"options": {"requestedPolicyVersion": 3}})
        return [(str(b.get("role")), "condition" in b) for b in policy.get("bindings", [])
                if member in b.get("members", [])]

    def role_permissions(self, role: str) -> list[str]:
        """The permissions a role grants (IAM roles.get: `roles/X`, `projects/P/roles/X`)."""
        found = self._google_http("IAM", "GET", self._google_url(IAM_URL, f"/v1/{role}"))
        return [str(p) for p in found.get("includedPermissions", [])]

    def import_os_login_key(self, user: str, public_key: str) -> str:
        """Add `public_key` to `user`'s OS Login profile (the OS Login API, through Google's
        client); returns the POSIX user name to log in as."""
        from google.api_core.client_options import ClientOptions
        from google.cloud import oslogin_v1

        if "oslogin" not in self._more:
            # A fake Compute endpoint (tests) serves the OS Login API too.
            options = (ClientOptions(api_endpoint=self.cfg.api_endpoint)
                       if self.cfg.api_endpoint else None)
            self._more["oslogin"] = oslogin_v1.OsLoginServiceClient(
                credentials=self._credentials, client_options=options, transport="rest")
        client = self._more["oslogin"]
        key = oslogin_v1.common.SshPublicKey(key=public_key)
        response = self.call("OS Login", lambda: client.import_ssh_public_key(
            parent=f"users/{user}", ssh_public_key=key, project_id=self.project,
            timeout=REQUEST_TIMEOUT_S, retry=None))
        accounts = list(response.login_profile.posix_accounts)
        primary = next((a for a in accounts if a.primary), accounts[0] if accounts else None)
        if primary is None or not primary.username:
            raise BadRequestError(f"OS Login gave {user} no POSIX account in project "
                                  f"{self.project}")
        return str(primary.username)

    def was_preempted(self, zone: str, name: str) -> bool:
        """True when a `compute.instances.preempted` operation targets this VM (the evidence
        that survives a DELETE termination action, gce-notes §A4)."""
        request = self._compute.ListZoneOperationsRequest(
            project=self.project, zone=zone,
            filter=f'operationType = "compute.instances.preempted" AND targetLink:"{name}"')
        ops = self.call(zone, lambda: list(self.zone_operations.list(
            request=request, timeout=REQUEST_TIMEOUT_S, retry=None)))
        return any(op.target_link.rsplit("/", 1)[-1] == name for op in ops)
