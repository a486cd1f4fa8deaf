"""``python -m orchestrator.init [DIR]`` (or ``transient-init``): start a repository of your own.

Writes a minimal user repository (:mod:`orchestrator.user_repo`) into DIR (default: the current
folder), never overwriting a file that exists::

    experiments/my_experiment.yaml  a small experiment that runs on this machine as it is
    conf/provider/lab.yaml          an SSH inventory to fill in          (--provider ssh|both)
    conf/provider/cloud.yaml        a Google Compute Engine provider     (--provider gce|both)
    .gitignore                      outputs/ and multirun/ (the results) stay out of git
    .github/workflows/validate-experiments.yml   CI: every experiment validated on each push

The provider files are copies of the packaged ``provider=ssh`` / ``provider=gce`` files (the
same keys and documented defaults as the installed version), under names of their own so they
are found before the packaged ones. The workflow installs the tool from where this installation
came from (:func:`install_line`): the tool is on no public index. Exit code 0, also when every
file already existed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.paths import CONF_DIR
from orchestrator.version import DISTRIBUTION, add_version_argument, prog_name, tool_version

EXPERIMENT = """\
# @package _global_
# Your first experiment: a small CNN on scikit-learn's 8x8 digits (bundled, no download), one
# parameter server and 2 workers as processes on this machine; about a minute on a laptop.
#   transient-orchestrator +experiment=my_experiment dry_run=true   # the plan and its price
#   transient-orchestrator +experiment=my_experiment                # train here
#   transient-orchestrator +experiment=my_experiment provider=lab   # on your machines (conf/provider/lab.yaml)
#   transient-validate                                              # every experiments/*.yaml, as CI does
# Groups (cluster, job, sync, provider, pricing, revocation, straggler) come from your conf/
# first, then from the installed tool's: transient-orchestrator --help lists them all.
defaults:
  - override /cluster: local_cpu
  - override /job: digits_cnn
  - override /sync: asp
  - override /provider: local
  - override /pricing: gce

name: my_experiment              # names the output folder: outputs/my_experiment/<time>/
description: "Small CNN on 8x8 digits, ASP, 2 workers as local processes"
tags: [digits, asp]
cluster:
  workers: 2
job:
  train_steps: 600
"""

GITIGNORE = """\
# results of transient-orchestrator runs (one folder per run; sweeps under multirun/)
outputs/
multirun/
# this machine's settings (data_cache, provider.project, ...): conf/local/default.yaml
conf/local/
"""

WORKFLOW = """\
# Every experiment of this repository composed, validated and planned on each push: a bad field
# fails the job with one line naming it; finding no experiment fails it too. The tool is
# installed from where `transient-init`'s own installation came from (validation needs no
# TensorFlow, so no extra).
name: validate-experiments
on: [push, pull_request]
jobs:
  validate:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {{python-version: "3.11"}}
      - run: {install}
      - run: transient-validate
"""

#: Starts the comment on the workflow's install line: the one line a user may have to change.
CHANGE_MARK = "# transient-orchestrator: change this line if"


def install_line(direct_url: Mapping[str, Any] | None, version: str | None) -> str:
    """The workflow's ``pip install`` command with its comment, for an installation that
    `direct_url` describes (its PEP 610 ``direct_url.json``; None when it has none: installed
    from a package index, or not installed at all) and its `version`.

    The tool is on no public index, so a bare ``pip install transient-orchestrator`` fails on
    the first push. A CI runner can reach a VCS repository (installed again at the very commit)
    and a remote archive (with its recorded hash, which pip checks); a local folder, wheel or
    editable checkout is a file:// URL only this machine reads, so those and index installs get
    the index line, pinned to `version`, and a comment saying what to put there instead.
    """
    info: Mapping[str, Any] = direct_url or {}
    url = str(info.get("url") or "")
    remote = bool(url) and not url.startswith("file:")
    vcs, archive, folder = info.get("vcs_info"), info.get("archive_info"), info.get("dir_info")
    fragment = [f"subdirectory={info['subdirectory']}"] if info.get("subdirectory") else []
    if remote and isinstance(vcs, Mapping) and vcs.get("vcs"):
        rev = vcs.get("commit_id") or vcs.get("requested_revision")
        req = f"{DISTRIBUTION} @ {vcs['vcs']}+{url}{f'@{rev}' if rev else ''}"
        why = ("CI cannot clone this repository (a private one needs a token in the URL) or "
               "should install another commit")
    elif remote and isinstance(archive, Mapping):
        hashes = archive.get("hashes")
        if isinstance(hashes, Mapping) and hashes.get("sha256"):
            fragment.insert(0, f"sha256={hashes['sha256']}")
        elif isinstance(archive.get("hash"), str) and "=" in archive["hash"]:
            fragment.insert(0, archive["hash"])  # the older "<algorithm>=<digest>" form
        req = f"{DISTRIBUTION} @ {url}"
        why = "the archive moves or CI should install another version"
    else:
        fragment = []
        known = version and version != "unknown"
        req = f"{DISTRIBUTION}=={version}" if known else DISTRIBUTION
        if isinstance(folder, Mapping):
            kind = "an editable checkout" if folder.get("editable") else "a local folder"
        else:
            kind = "a local archive" if isinstance(archive, Mapping) else "a local clone"
        source = (f"this tool was installed from {kind} ({url}) that a CI runner cannot reach"
                  if url else "this installation records no URL: it came from a package index "
                  "or a source tree")
        why = (f"no index your CI reads serves {req} ({source}); install it from the tool's "
               "git repository instead: pip install 'transient-orchestrator @ git+URL@COMMIT'")
    if fragment and "#" not in req:
        req += "#" + "&".join(fragment)
    return f"pip install {shlex.quote(req)}   {CHANGE_MARK} {why}"


def this_installation() -> tuple[dict[str, Any] | None, str | None]:
    """This tool's PEP 610 ``direct_url.json`` (None when it records none) and its version: what
    :func:`install_line` needs to install the same tool in CI."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None, tool_version()
    text = dist.read_text("direct_url.json")
    try:
        direct = json.loads(text) if text else None
    except ValueError:
        direct = None
    return (direct if isinstance(direct, dict) else None), dist.version


_HEADERS = {
    "ssh": ("# Your machines over SSH: replace the example inventory below with yours (addresses, "
            "user,\n# key_path, python), then run with provider=lab. Copied from the installed "
            "tool's\n# provider=ssh file by `transient-init`; every key is documented there.\n"),
    "gce": ("# Google Compute Engine: set project (or $GOOGLE_CLOUD_PROJECT), zones and ssh_key, "
            "then run\n# with provider=cloud. Copied from the installed tool's provider=gce file "
            "by\n# `transient-init`; README \"Running on Google Cloud\" covers auth and quotas.\n"),
}
PROVIDER_FILES = {"ssh": "lab.yaml", "gce": "cloud.yaml"}


def files_for(providers: Sequence[str]) -> dict[str, str]:
    """Relative path -> content of every file ``init`` writes for the chosen providers."""
    files = {"experiments/my_experiment.yaml": EXPERIMENT}
    for backend in providers:
        packaged = (CONF_DIR / "provider" / f"{backend}.yaml").read_text()
        files[f"conf/provider/{PROVIDER_FILES[backend]}"] = _HEADERS[backend] + packaged
    files[".gitignore"] = GITIGNORE
    files[".github/workflows/validate-experiments.yml"] = WORKFLOW.format(
        install=install_line(*this_installation()))
    return files


def init(target: Path, providers: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """Write the starter files under ``target``; returns (written, kept because they existed).

    A file is created only if nothing is at its path (``open(..., "x")``), so a concurrent
    writer or an existing file is never overwritten.
    """
    written: list[Path] = []
    kept: list[Path] = []
    for rel, content in files_for(providers).items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(content)
        except FileExistsError:
            kept.append(path)
            continue
        written.append(path)
    return written, kept


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog_name("orchestrator.init"),
        description="Write a minimal repository of your own experiments (an example "
        "experiment, a provider file to fill in, .gitignore, a CI job); existing files are "
        "kept as they are.")
    parser.add_argument("dir", nargs="?", type=Path, default=Path("."),
                        help="the repository's root (default: the current folder)")
    parser.add_argument("--provider", choices=("ssh", "gce", "both"), default="both",
                        help="which provider file to write (default: both)")
    add_version_argument(parser, "orchestrator.init")
    args = parser.parse_args(argv)
    providers = ("ssh", "gce") if args.provider == "both" else (args.provider,)
    target: Path = args.dir
    written, kept = init(target, providers)
    for path in written:
        print(f"wrote {path}")
    for path in kept:
        print(f"kept  {path} (exists; not changed)")
    if any(p.name == ".gitignore" for p in kept):
        lines = (target / ".gitignore").read_text().split()
        missing = [e for e in ("outputs/", "multirun/", "conf/local/") if e not in lines]
        if missing:
            print(f"note: add {', '.join(missing)} to .gitignore (run results, this "
                  "machine's settings)")
    where = "" if target.resolve() == Path.cwd().resolve() else f"cd {target} && "
    print(f"next: {where}transient-validate && "
          "transient-orchestrator +experiment=my_experiment dry_run=true")
    return 0


def run() -> None:
    """Console entry point ``transient-init``."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
