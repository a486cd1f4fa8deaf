"""Where this project's code is: a source checkout, or an installed package (wheel, sdist).

Local roles import `trainer` from it (`provider=local` puts a checkout on PYTHONPATH), remote
hosts get the wheel built from it (`provider=ssh`/`gce`), and the orchestrator finds its config
tree, experiments and reference data beside it (`orchestrator.paths`). It lives here, below both
users, because `provisioning/` may not import `orchestrator/`.

An installed tool has no checkout, so the hosts' wheel is rebuilt from the installed files
(:func:`installed_source_tree`): the installed packages, the project's own pyproject.toml (the
package carries it as `provisioning/shipped_pyproject.toml`), and the README and license files
from the installed distribution's metadata. Hosts then run exactly the installed version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.layout import DISTRIBUTION

if TYPE_CHECKING:
    from importlib import metadata

#: Where our packages are: the source checkout, or site-packages for an installed tool.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: The project's pyproject.toml as the installed package carries it (a link in the checkout).
SHIPPED_PYPROJECT = Path(__file__).resolve().parent / "shipped_pyproject.toml"


def is_checkout(root: Path = PROJECT_ROOT) -> bool:
    """True when our packages run from a source checkout (pyproject.toml beside them)."""
    return (root / "pyproject.toml").is_file()


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "transient-orchestrator" / "installed-source"


#: The packages that run on hosts (the hosts' wheel is built from a subset of them).
HOST_PACKAGES = ("trainer", "provisioning")


def installed_source_tree(items: Sequence[str] | None = None) -> Path:
    """A source tree rebuilt from the installed tool, laid out as a checkout, holding ``items``
    (default: what a hosts' wheel build reads: pyproject.toml, README.md, the license files,
    :data:`HOST_PACKAGES`).

    Packages (folders) are copied from where they are installed, `pyproject.toml` is the shipped
    copy, `README.md` is the long description of the installed metadata, license files come from
    the distribution's `licenses/`. The tree is kept in the user's cache, one per installed
    version (named by the digest of the distribution's RECORD, which lists every installed file's
    hash, and the items), written to a temporary folder and renamed into place, so concurrent
    runs never see half of it.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError as ex:
        raise RuntimeError(
            f"{PROJECT_ROOT} is neither a source checkout (no pyproject.toml) nor an installed "
            f"{DISTRIBUTION}: the hosts' wheel cannot be built") from ex
    if items is None:
        licenses = dist.metadata.get_all("License-File") or []  # type: ignore[attr-defined]
        items = ["pyproject.toml", "README.md", *licenses, *HOST_PACKAGES]
    record = dist.read_text("RECORD") or ""
    key = hashlib.sha256("\0".join([dist.version, record, *items]).encode()).hexdigest()[:20]
    target = _cache_dir() / f"{dist.version}-{key}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        for item in items:
            _materialise(item, staging / item, dist)
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:  # another run put it there first: theirs is the same
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _materialise(item: str, dest: Path, dist: metadata.Distribution) -> None:
    """Write one item of the source tree (see :func:`installed_source_tree`)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    installed = PROJECT_ROOT / item
    if item == "pyproject.toml":
        shutil.copy2(SHIPPED_PYPROJECT, dest)
    elif item == "README.md":  # the long description is the README, verbatim
        payload = dist.metadata.get_payload()  # type: ignore[attr-defined]
        dest.write_text(payload if isinstance(payload, str) else "", encoding="utf-8")
    elif installed.is_dir():
        shutil.copytree(installed, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:  # a license file: the distribution keeps it under <name>.dist-info/licenses/
        licenses = [Path(str(dist.locate_file(f))) for f in dist.files or ()
                    if f.as_posix().endswith(f".dist-info/licenses/{item}")]
        for candidate in (*licenses, installed):
            if candidate.is_file():
                shutil.copy2(candidate, dest)
                return
        raise RuntimeError(f"the installed {DISTRIBUTION} has no {item} to build the hosts' "
                           "wheel from")
