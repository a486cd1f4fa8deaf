"""Who may do what on the VMs, read before any VM exists (audit S4, D1), one line per problem.

- OS Login with 2-step verification (`enable-oslogin-2fa=TRUE`) asks every SSH login for a
  second factor, which a run cannot give: refused while OS Login is on.
- The VMs' service account (`provider.service_account`, else the project's default compute
  account) must exist: an insert naming a deleted one (a common hardening) fails with a 400 that
  names no setting. With a lease (`provider.lease_s`), it must also be allowed to delete its own
  VM (`compute.instances.delete`): organisations created since May 2024 give the default account
  no role (`iam.automaticIamGrantsForDefaultServiceAccounts`), and a watcher that cannot delete
  powers its VM off instead: TERMINATED, its disk billed, `maxRunDuration` cleared, until
  `python -m orchestrator.gc` deletes it.

How the permission is checked: `projects.testIamPermissions` answers for the caller, not for
another account, so the project's IAM policy is read (Resource Manager `getIamPolicy`) and the
roles bound to `serviceAccount:EMAIL` are expanded (IAM `roles.get`; the predefined roles known to
carry the permission are not asked). It cannot see roles granted on a folder or the organisation,
or through a group, and counts a conditional binding as granting; a policy the caller may not
read leaves the roles unchecked (said in the dry run), never refused.
"""

from __future__ import annotations

from typing import Any

from provisioning.base import ProvisionError
from provisioning.gce.config import GceConfig

DELETE_PERMISSION = "compute.instances.delete"
#: Predefined roles that grant DELETE_PERMISSION (the basic ones and Compute's admin roles).
DELETING_ROLES = frozenset({"roles/owner", "roles/editor", "roles/compute.admin",
                            "roles/compute.instanceAdmin", "roles/compute.instanceAdmin.v1"})
GRANT_ROLE = "roles/compute.instanceAdmin.v1"


def metadata_true(value: str | None) -> bool:
    """A boolean metadata value as GCE reads it (TRUE, true, 1, yes)."""
    return (value or "").strip().lower() in ("true", "1", "yes", "y")


def two_factor_problem(project: str, metadata: dict[str, str]) -> str | None:
    """The line refusing OS Login's 2-step verification, or None when it is off."""
    if not metadata_true(metadata.get("enable-oslogin-2fa")):
        return None
    return (f"provider.project: project {project} has OS Login with 2-step verification "
            "(enable-oslogin-2fa=TRUE), which asks every SSH login for a second factor that "
            "a non-interactive run cannot give; use a project without it")


def vm_account(cfg: GceConfig, default_account: str) -> str | None:
    """The e-mail of the account the VMs run as (`body.instance_body`): the configured one,
    the default compute account for the lease, or None (no lease, no account)."""
    if cfg.service_account and cfg.service_account != "default":
        return cfg.service_account
    if cfg.service_account or cfg.lease_s > 0:
        return default_account or None
    return None


def account_lines(api: Any, cfg: GceConfig, info: Any, os_login: bool
                  ) -> tuple[list[str], list[str]]:
    """(fits, short) for OS Login's 2-step verification and the VMs' service account (module
    docstring); `info` is the preflight's `ProjectInfo`."""
    fits: list[str] = []
    short: list[str] = []
    problem = two_factor_problem(api.project, info.metadata) if os_login else None
    if problem is not None:
        short.append(problem)
    account = vm_account(cfg, info.default_service_account)
    if account is None:
        return fits, short
    chosen = "provider.service_account" if cfg.service_account else \
        "the default compute account (provider.service_account: null)"
    try:
        exists = api.service_account_exists(account)
    except ProvisionError as error:
        fits.append(f"not checked: service account {account} ({' '.join(str(error).split())})")
        return fits, short
    if not exists:
        off = ", or set provider.lease_s=0 (no lease: the VMs get no account)" \
            if not cfg.service_account else ""
        short.append(f"provider.service_account: {account}, {chosen}, does not exist or is "
                     f"disabled in project {api.project}, so every VM insert would fail; name "
                     f"an existing account{off}")
        return fits, short
    if cfg.lease_s <= 0:
        fits.append(f"service account {account} exists")
        return fits, short
    granted, unread = _deleting_roles(api, account)
    if granted is None:
        fits.append(f"service account {account} exists; its roles not checked ({unread[0]})")
    elif granted:
        fits.append(f"service account {account} may delete its VM ({granted[0]}): the lease "
                    "can end VMs")
    elif unread:
        fits.append(f"service account {account} exists; its roles {', '.join(unread)} could "
                    "not be read: not checked")
    else:
        short.append(
            f"provider.service_account: {account} has no role on project {api.project} that "
            f"allows {DELETE_PERMISSION}, so a VM whose lease ran out could only power itself "
            f"off and bill its disk until `python -m orchestrator.gc`; grant {GRANT_ROLE} "
            f"(gcloud projects add-iam-policy-binding {api.project} "
            f"--member=serviceAccount:{account} --role={GRANT_ROLE}), name an account that "
            "has it, or set provider.lease_s=0")
    return fits, short


def _deleting_roles(api: Any, account: str) -> tuple[list[str] | None, list[str]]:
    """(roles of the project's policy that let `account` delete VMs, None when the policy
    cannot be read; roles whose permissions could not be read, or why the policy could not)."""
    return _granting_roles(api, account, DELETE_PERMISSION, DELETING_ROLES)


def _granting_roles(api: Any, account: str, permission: str, known: frozenset[str]
                    ) -> tuple[list[str] | None, list[str]]:
    """(roles of the project's policy that grant `account` `permission` (`known`: predefined
    roles that do, not asked), None when the policy cannot be read; roles whose permissions
    could not be read, or why the policy could not)."""
    try:
        roles = api.project_roles(f"serviceAccount:{account}")
    except ProvisionError as error:
        return None, [f"cannot read the project's IAM policy: {' '.join(str(error).split())}"]
    granted: list[str] = []
    unread: list[str] = []
    for role, _conditional in roles:  # a condition is not evaluated: it may grant
        if role in known:
            granted.append(role)
            continue
        try:
            if permission in api.role_permissions(role):
                granted.append(role)
        except ProvisionError:
            unread.append(role)
    return granted, unread


_BASIC = frozenset({"roles/owner", "roles/editor"})
#: What a detached sweep's controller does as its service account, and the role to grant for
#: each: create and delete the sweep's VMs (and renew their leases), attach the VMs' own
#: account to them, and write its state to the bucket.
CONTROLLER_NEEDS: dict[str, tuple[frozenset[str], str]] = {
    "compute.instances.create": (DELETING_ROLES, GRANT_ROLE),
    DELETE_PERMISSION: (DELETING_ROLES, GRANT_ROLE),
    "compute.instances.setMetadata": (DELETING_ROLES, GRANT_ROLE),
    "iam.serviceAccounts.actAs": (_BASIC | {"roles/iam.serviceAccountUser"},
                                  "roles/iam.serviceAccountUser"),
    "storage.objects.create": (_BASIC | {"roles/storage.admin", "roles/storage.objectAdmin"},
                               "roles/storage.objectAdmin"),
}
#: Permissions that may be granted on the bucket instead of the project (not seen here).
_BUCKET_LEVEL = frozenset({"storage.objects.create"})


def controller_account_lines(api: Any, cfg: GceConfig, default_account: str
                             ) -> tuple[list[str], list[str]]:
    """(fits, short) for a detached sweep's controller account (`provider.service_account`,
    else the default compute account): it exists and its project roles grant
    CONTROLLER_NEEDS. A storage permission not seen on the project may be granted on the
    bucket: said, not refused; a policy that cannot be read is said, never refused."""
    account = (cfg.service_account if cfg.service_account and cfg.service_account != "default"
               else default_account)
    if not account:
        return [], ["provider.service_account: the project has no default compute account "
                    "for the controller VM; name one that may create and delete VMs and write "
                    "the bucket"]
    try:
        if not api.service_account_exists(account):
            return [], [f"provider.service_account: {account}, the controller's account, does "
                        f"not exist or is disabled in project {api.project}"]
    except ProvisionError as error:
        return [f"not checked: the controller's account {account} "
                f"({' '.join(str(error).split())})"], []
    fits: list[str] = []
    missing: list[tuple[str, str]] = []
    for permission, (known, grant) in CONTROLLER_NEEDS.items():
        granted, unread = _granting_roles(api, account, permission, known)
        if granted is None:
            return [f"the controller's account {account}: roles not checked ({unread[0]})"], []
        if granted:
            continue
        if unread:
            fits.append(f"the controller's account {account}: {permission} not checked (roles "
                        f"{', '.join(unread)} could not be read)")
        elif permission in _BUCKET_LEVEL:
            fits.append(f"the controller's account {account}: {permission} not granted on the "
                        "project; it must be on the bucket (roles/storage.objectAdmin), or the "
                        "controller cannot record the sweep")
        else:
            missing.append((permission, grant))
    if not missing:
        return [*fits, f"the controller's account {account} may create and delete the sweep's "
                       "VMs"], []
    grants = sorted({grant for _, grant in missing})
    return fits, [
        f"provider.service_account: {account}, the controller's account, lacks "
        f"{', '.join(p for p, _ in missing)} on project {api.project}, so the controller could "
        f"not run the sweep; grant {' and '.join(grants)} (gcloud projects "
        f"add-iam-policy-binding {api.project} --member=serviceAccount:{account} "
        f"--role=ROLE), or name an account that has them"]
