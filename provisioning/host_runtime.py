"""The hosts' runtime: what a machine that runs roles needs, read from the one place it is declared.

`pyproject.toml` declares it: the `host` extra (what `python -m trainer` imports besides
TensorFlow), `host-cpu`/`host-gpu` (that plus TensorFlow's CPU or CUDA build), and
`[tool.transient-orchestrator.hosts]` (the CPython minors and the wheel platform it installs on).
The orchestrator's own `cpu`/`gpu` extras reference these, so a local run and a remote host run
the same set. This module reads it (the orchestrator side only: `tomllib`, Python >= 3.11) for
the hosts' wheel (`setup.build_wheel`), the host-side install (`host_setup.py` gets the
requirement lines and the supported Pythons in its spec), the wheelhouse built for a host's
Python and platform (`pip download --python-version --platform`), and the checks that refuse an
unsupported host or image in one line.
"""

from __future__ import annotations

import functools
import hashlib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from provisioning.checkout import SHIPPED_PYPROJECT

#: The Deep Learning VM family VMs boot by default: Ubuntu 24.04 (Python 3.12), CUDA 12.9 and
#: driver 580, no framework. DLVM families retire (getFromFamily answers 404 once all their
#: images are deprecated): check with `gcloud compute images describe-from-family FAMILY
#: --project deeplearning-platform-release`; the pre-flight names the newest of the same line.
DEFAULT_IMAGE_FAMILY = "common-cu129-ubuntu-2404-nvidia-580"

#: The orchestrator's distribution name (self-references in its extras use it).
DIST_NAME = "transient-orchestrator"
#: The extras a host installs, by `provider.extra`.
EXTRAS = ("cpu", "gpu")


@dataclass(frozen=True)
class HostRuntime:
    """The hosts' dependency set and where it installs (see the module docstring)."""

    version: str  # the project's version (the hosts' wheel carries it)
    base: tuple[str, ...]  # the `host` extra: needed on every host
    extras: dict[str, tuple[str, ...]]  # cpu/gpu -> TensorFlow's requirement (besides `base`)
    min_minor: int  # CPython 3.<min_minor> ... 3.<max_minor>, both included
    max_minor: int
    platform: str  # e.g. manylinux_2_27_x86_64: the oldest glibc and the machine it needs

    def requirements(self, extra: str) -> list[str]:
        """Every requirement line a host with `extra` (cpu, gpu) installs."""
        if extra not in self.extras:
            raise ValueError(f"unknown extra {extra!r} (one of {', '.join(self.extras)})")
        return [*self.base, *self.extras[extra]]

    def digest(self, extra: str) -> str:
        """Names an installed dependency set: the requirement lines (a change makes a new env)."""
        return hashlib.sha256("\n".join(["deps-v1", extra, *self.requirements(extra)])
                              .encode()).hexdigest()[:16]

    @property
    def requires_python(self) -> str:
        return f">=3.{self.min_minor},<3.{self.max_minor + 1}"

    def pythons(self) -> str:
        """'3.11–3.13', for messages."""
        return f"3.{self.min_minor}–3.{self.max_minor}"

    @property
    def machine(self) -> str:
        return _platform_parts(self.platform)[1]

    @property
    def glibc(self) -> tuple[int, int]:
        return _platform_parts(self.platform)[0]

    def host_check(self) -> dict[str, object]:
        """What `host_setup.py` checks an interpreter against (JSON-able)."""
        return {"minors": [self.min_minor, self.max_minor], "machine": self.machine,
                "glibc": list(self.glibc), "platform": self.platform,
                "pythons": self.pythons()}


def _platform_parts(platform: str) -> tuple[tuple[int, int], str]:
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not match:
        raise ValueError(f"[tool.transient-orchestrator.hosts] platform {platform!r} is not "
                         "manylinux_X_Y_ARCH")
    return (int(match[1]), int(match[2])), match[3]


def platform_tags(glibc: tuple[int, int], machine: str) -> list[str]:
    """Every manylinux tag a host with this glibc and machine runs, for `pip download
    --platform` (pip does not expand a tag to the older ones it implies)."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{machine}" for m, name in legacy.items() if major == 2 and minor >= m]
    return tags


def _expand(extras: dict[str, list[str]], name: str, seen: tuple[str, ...] = ()) -> list[str]:
    """The requirement lines of extra `name`, self-references (`transient-orchestrator[host]`)
    replaced by the lines they name."""
    out: list[str] = []
    for line in extras[name]:
        match = re.fullmatch(rf"\s*{re.escape(DIST_NAME)}\s*\[([\w,\s-]+)\]\s*", line)
        if match is None:
            out.append(line)
            continue
        for ref in (r.strip() for r in match[1].split(",")):
            if ref in seen or ref not in extras:
                raise ValueError(f"pyproject.toml: extra {name!r} names {ref!r}, "
                                 "which is missing or circular")
            out += _expand(extras, ref, (*seen, name))
    return out


def parse(pyproject: dict) -> HostRuntime:  # type: ignore[type-arg]
    """The hosts' runtime from a parsed pyproject.toml."""
    project = pyproject["project"]
    extras = project["optional-dependencies"]
    hosts = pyproject["tool"]["transient-orchestrator"]["hosts"]
    match = re.fullmatch(r">=\s*3\.(\d+)\s*,\s*<\s*3\.(\d+)", hosts["requires-python"])
    if not match:
        raise ValueError("[tool.transient-orchestrator.hosts] requires-python must read "
                         "'>=3.X,<3.Y'")
    base = _expand(extras, "host")
    by_extra = {}
    for extra in EXTRAS:
        lines = _expand(extras, f"host-{extra}")
        by_extra[extra] = tuple(ln for ln in lines if ln not in base)
    runtime = HostRuntime(project["version"], tuple(base), by_extra, int(match[1]),
                          int(match[2]) - 1, hosts["platform"])
    _platform_parts(runtime.platform)  # a malformed platform fails here, not on a host
    return runtime


@functools.cache
def load(root: Path | None = None) -> HostRuntime:
    """The hosts' runtime declared in `<root>/pyproject.toml`; by default the project's own
    (the copy the installed package carries, a link to the checkout's pyproject.toml)."""
    path = root / "pyproject.toml" if root is not None else SHIPPED_PYPROJECT
    with open(path, "rb") as f:
        return parse(tomllib.load(f))


#: What a cloud image family's own `python3` is, where its name says (GCE's Deep Learning VM
#: families name their OS: Ubuntu 22.04 ships 3.10, 24.04 3.12; Debian 11/12/13 ship 3.9/3.11/
#: 3.13; older DLVM families say `py310`). None: not known from the name.
_FAMILY_PYTHON = ((re.compile(r"py3(\d{1,2})\b"), None), (re.compile(r"ubuntu-2004"), 8),
                  (re.compile(r"ubuntu-2204"), 10), (re.compile(r"ubuntu-2404"), 12),
                  (re.compile(r"debian-11"), 9), (re.compile(r"debian-12"), 11),
                  (re.compile(r"debian-13"), 13))


def image_family_python(family: str) -> int | None:
    """The minor of `python3` on images of `family` where its name tells, else None."""
    for pattern, minor in _FAMILY_PYTHON:
        match = pattern.search(family)
        if match:
            return int(match[1]) if minor is None else minor
    return None


def image_family_problem(family: str, runtime: HostRuntime | None = None) -> str | None:
    """Why VMs of `family` cannot install the hosts' runtime, known before any VM exists (its
    name tells an unsupported `python3`); None when fine or unknown (the host's probe decides)."""
    runtime = runtime or load()
    minor = image_family_python(family)
    if minor is None or runtime.min_minor <= minor <= runtime.max_minor:
        return None
    return (f"images of family {family!r} have Python 3.{minor}, and the hosts' runtime "
            f"(TensorFlow 2.21) installs on Python {runtime.pythons()}: choose a family with "
            f"one (e.g. {DEFAULT_IMAGE_FAMILY}, Python 3.12), a baked image "
            f"(provider.image), or set provider.python to an interpreter there that already "
            f"has TensorFlow 2.21")


#: A baked image's name (`python -m orchestrator.image bake`): the extra and the dependency set's
#: digest are read back from it, so a run never uses an image baked for another set silently.
BAKED_NAME = re.compile(r"transient-host-(?P<extra>cpu|gpu)-(?P<deps>[0-9a-f]{12})-[0-9a-f]{8}$")


def baked_image_name(base_image: str, extra: str, runtime: HostRuntime | None = None) -> str:
    """The name of the image baked from `base_image` (a family or image URL) for this
    dependency set: deterministic, so baking the same again finds it."""
    digest = (runtime or load()).digest(extra)[:12]
    return (f"transient-host-{extra}-{digest}-"
            f"{hashlib.sha256(base_image.encode()).hexdigest()[:8]}")


def stale_image_problem(image: str, runtime: HostRuntime | None = None) -> str | None:
    """Why `provider.image`, a baked image by its name, cannot serve this dependency set; None
    when it can or is not one of ours."""
    match = BAKED_NAME.search(image)
    if match is None:
        return None
    want = (runtime or load()).digest(match["extra"])[:12]
    if match["deps"] == want:
        return None
    return (f"{image} was baked for another set of the hosts' dependencies ({match['deps']}; "
            f"this project's is {want}): bake a new one with `python -m orchestrator.image "
            f"bake` and use that")
