"""Wheelhouses for the isolated hosts' package index: the wheels a host of a given Python minor
needs, downloaded from the package index by the test machine's pip for the *host's* Python and
platform (not the test machine's), cached outside the checkout.

`wheelhouse(["tensorflow-cpu==2.21.*"], "3.13")` returns a directory of manylinux x86_64 wheels
for CPython 3.13 with every dependency resolved. `IsolatedTestBed.serve_index(path)` serves it to
the hosts as a PyPI-compatible index. Entries live at `<cache>/wheels/py<X.Y>-<digest>/` (the
digest covers the requirements, Python and glibc), built into a temporary directory and
renamed into place under a lock.

CLI: `python -m tests.testbed.wheelhouse 3.13 tensorflow-cpu==2.21.*` prints the path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from provisioning import host_runtime
from tests.testbed import images

# Both images' glibc is >= 2.36 (Debian 12). pip does not expand a manylinux tag to the older
# ones a host also accepts, so every one is named (what `pip debug --verbose` lists on a host).
GLIBC = "2.36"
# What a bare host installs: the project's own declaration of the hosts' set (pyproject's
# `host-cpu` extra, provisioning/host_runtime.py), and pip, which a host fetches from the index.
HOST_REQUIREMENTS = (*host_runtime.load().requirements("cpu"), "pip")
DOWNLOAD_TIMEOUT_S = 1800


def platforms(glibc: str = GLIBC) -> list[str]:
    """The manylinux x86_64 platform tags a host with that glibc installs, newest first."""
    minor = int(glibc.split(".")[1])
    return ([f"manylinux_2_{m}_x86_64" for m in range(minor, 4, -1)]
            + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"])


def _key(requirements: Sequence[str], python: str, glibc: str, extra: Sequence[str]) -> str:
    text = "\n".join([f"python={python}", f"glibc={glibc}", *sorted(requirements),
                      "extra=" + ",".join(extra)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def path(requirements: Sequence[str], python: str, glibc: str = GLIBC,
         extra_wheels: Sequence[str] = ()) -> Path:
    """Where that wheelhouse is (or will be once built)."""
    return (images.cache_dir() / "wheels"
            / f"py{python}-{_key(requirements, python, glibc, extra_wheels)}")


def wheelhouse(requirements: Sequence[str] = HOST_REQUIREMENTS, python: str = "3.11",
               glibc: str = GLIBC, extra_wheels: Sequence[str] = ()) -> Path:
    """A directory holding binary wheels of `requirements` and all their dependencies for
    CPython `python` ("3.13") on x86_64 Linux with glibc >= `glibc`; downloaded once, then
    cached. `extra_wheels`: requirements added as they are (e.g. "pip", "setuptools", "wheel"
    for a host's venv)."""
    final = path(requirements, python, glibc, extra_wheels)

    def download(tmp: Path) -> str:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
             *(a for p in platforms(glibc) for a in ("--platform", p)), "-d", str(tmp),
             *requirements, *extra_wheels],
            check=True, timeout=DOWNLOAD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        return (f"{' '.join(requirements)} for cp{python}, glibc {glibc}; "
                f"downloaded in {time.monotonic() - started:.0f} s")

    return _cached(final, download)


#: Dependencies of the tool that PyPI has only as source archives (hydra-core 1.3's pinned
#: ANTLR runtime, lifelines' autograd-gamma): pure Python, so their wheels are built here once
#: (`pip wheel`) and a controller's index serves them beside the downloaded ones.
SDIST_ONLY = ("antlr4-python3-runtime==4.9.3", "autograd-gamma")


def tool_requirements() -> list[str]:
    """The tool's own dependencies (pyproject.toml's [project] dependencies): what a detached
    sweep's controller installs with the tool (no TensorFlow: it runs no role)."""
    import tomllib

    from provisioning.checkout import PROJECT_ROOT

    with open(PROJECT_ROOT / "pyproject.toml", "rb") as fh:
        return list(tomllib.load(fh)["project"]["dependencies"])


def controller_wheelhouse(python: str = "3.13", glibc: str = GLIBC) -> Path:
    """The wheels a controller VM of `python` installs the tool with: its dependencies and
    pip, the source-only ones built into wheels first (SDIST_ONLY); cached like `wheelhouse`."""
    requirements = tool_requirements()
    final = path(requirements, python, glibc, ("pip", *SDIST_ONLY))

    def download(tmp: Path) -> str:
        started = time.monotonic()
        built = tmp / "built"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "-w", str(built), *SDIST_ONLY],
                       check=True, timeout=DOWNLOAD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
             *(a for p in platforms(glibc) for a in ("--platform", p)), "--find-links",
             str(built), "-d", str(tmp), *requirements, "pip"],
            check=True, timeout=DOWNLOAD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        shutil.rmtree(built)
        return (f"the tool's dependencies for cp{python}, glibc {glibc}; downloaded in "
                f"{time.monotonic() - started:.0f} s")

    return _cached(final, download)


def merged(requirements: Sequence[str] = HOST_REQUIREMENTS,
           pythons: Sequence[str] = ("3.11", "3.13"), glibc: str = GLIBC,
           extra_wheels: Sequence[str] = ()) -> Path:
    """One directory with the wheelhouses of every Python in `pythons` (hard links, cached):
    what one index serves to hosts of several images; each host's pip picks its own wheels."""
    parts = [wheelhouse(requirements, p, glibc, extra_wheels) for p in pythons]
    final = images.cache_dir() / "wheels" / ("merged-" + hashlib.sha256(
        " ".join(p.name for p in parts).encode()).hexdigest()[:12])

    def link(tmp: Path) -> str:
        tmp.mkdir(parents=True)
        for part in parts:
            for wheel in part.glob("*.whl"):
                if not (tmp / wheel.name).exists():
                    os.link(wheel, tmp / wheel.name)
        return " ".join(p.name for p in parts)

    return _cached(final, link)


def _cached(final: Path, fill: Callable[[Path], str]) -> Path:
    """`final`, made once by `fill(tmp)` (which returns a line for its `.complete` file) in a
    temporary directory renamed into place under a lock: never half there, even after a
    crash or with several test sessions asking at once."""
    if (final / ".complete").exists():
        return final
    with images._lock(final.parent / f".{final.name}.lock"):
        if (final / ".complete").exists():
            return final
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            note = fill(tmp)
            (tmp / ".complete").write_text(note + "\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m tests.testbed.wheelhouse X.Y [REQUIREMENT ...]", file=sys.stderr)
        return 2
    print(wheelhouse(args[1:] or HOST_REQUIREMENTS, args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
