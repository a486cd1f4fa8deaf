"""Cloud Storage reads on a VM with the standard library only: the hosts' wheel carries only
`trainer` (no Google client library), yet a VM must download a dataset the orchestrator staged
in `provider.storage` (or a `job.data_dir` of `gs://...`) itself, so nothing crosses the
user's uplink once per VM.

The VM's identity is its service account: an OAuth access token from the metadata server
(`instance/service-accounts/default/token`, header ``Metadata-Flavor: Google``; the VM needs
the `devstorage.read_only` scope, `provisioning/gce/body.py` grants it when storage is set).
Objects are read with the JSON API's media download (``GET {root}/storage/v1/b/BUCKET/o/
NAME?alt=media``, NAME percent-encoded with its slashes). `$TRANSIENT_METADATA_URL` and
`$TRANSIENT_STORAGE_URL` (or ``--endpoint``) point both at local stand-ins in tests; against a
storage emulator without a metadata server no token is sent (an emulator checks none).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
METADATA_URL_ENV = "TRANSIENT_METADATA_URL"  # the metadata server's root (tests: the fake's)
STORAGE_URL = "https://storage.googleapis.com"
STORAGE_URL_ENV = "TRANSIENT_STORAGE_URL"  # the JSON API's root (tests: an emulator)
TOKEN_PATH = "instance/service-accounts/default/token"
TOKEN_TIMEOUT_S = 10.0
#: Answers worth another try (rate limit, server errors), as Google's retry guidance lists.
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})


class NoToken(Exception):
    """The metadata server gave no token (no service account, or not on a VM)."""


def split_url(url: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at either end) of ``gs://BUCKET[/PREFIX]``; ValueError
    for anything else."""
    if not url.startswith("gs://") or not url[5:].split("/", 1)[0]:
        raise ValueError(f"not a gs:// URL: {url!r} (expected gs://BUCKET[/PREFIX])")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def storage_root(endpoint: str | None = None) -> str:
    """The JSON API root: `endpoint`, else $TRANSIENT_STORAGE_URL, else Google's."""
    return (endpoint or os.environ.get(STORAGE_URL_ENV) or STORAGE_URL).rstrip("/")


def media_url(root: str, bucket: str, name: str) -> str:
    """The media download URL of object `name` in `bucket` (the name's slashes encoded too)."""
    return (f"{root}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
            f"{urllib.parse.quote(name, safe='')}?alt=media")


def wants_token(root: str) -> bool:
    """Whether requests to `root` carry the VM's token: always for Google's API; for another
    root (an emulator) only when a metadata server is named ($TRANSIENT_METADATA_URL)."""
    return root == STORAGE_URL or bool(os.environ.get(METADATA_URL_ENV))


def access_token() -> str:
    """The VM's service-account access token, asked afresh (tokens last about an hour; one
    request per object keeps a long download valid). Raises NoToken with the reason."""
    base = (os.environ.get(METADATA_URL_ENV) or METADATA_URL).rstrip("/")
    request = urllib.request.Request(f"{base}/{TOKEN_PATH}",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=TOKEN_TIMEOUT_S) as resp:
            return str(json.loads(resp.read())["access_token"])
    except urllib.error.HTTPError as err:
        raise NoToken(f"the metadata server gave no token (HTTP {err.code}: the VM has no "
                      f"service account)") from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
        raise NoToken(f"no token from the metadata server {base}: "
                      f"{getattr(err, 'reason', err)}") from None
