"""Runs ON an SSH machine, by the machine's interpreter: makes or reuses one trainer environment.

This file is not imported by the orchestrator: `provisioning.ssh.setup` sends its text as one
`python -c` command (stdlib only), so a machine's whole setup costs one remote
command: each command starts the login shell, which on lab servers often sources a slow
`~/.bashrc` (conda or pyenv init), and pip alone costs a second of CPU per host. The argument
is a JSON object:

- `envs`: folder of the environments; `digest`: the wheel's content digest; `flavour`: a short
  hash of the interpreter and extra; `wheel`: the wheel's path on this machine (already copied);
- `mode`: `site` (the interpreter already has the trainer's dependencies) or `venv` (a venv
  without pip, named by `deps`, a digest of the wheel's declared dependencies and `extra`, is
  made once: pip, run from the wheelhouse's own pip wheel, installs the dependencies from
  `wheelhouse` with no package index); `name`: the wheel's project name;
- in both modes the wheel itself is unpacked into `<env>/site` (no pip, no bytecode
  compilation), which the trainer gets on PYTHONPATH, so new code costs an unpack, not a venv.

The environment is named `<digest>-py<X.Y>-<flavour>` and marked ready last, under an `flock`
on `<env>.lock`, so concurrent runs never see half an environment and a second run installs
nothing. Prints one JSON line: `{"env": path, "python": the interpreter to run the trainer
with, "version": "X.Y", "installed": bool, "deps_installed": bool}`.
"""

import base64
import fcntl
import hashlib
import json
import os
import shutil
import sys
import zipfile

# glob and subprocess are imported where a venv is built: most setups only unpack a wheel, and
# this script's own start is a part of every host's setup

READY = ".ready"
INSTALLER = "transient-orchestrator"


def unpack_wheel(wheel, site):
    """Install a pure-Python wheel by unpacking it (what pip does for one, minus compiling),
    recording the installer in `.dist-info` and adding it to RECORD."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        extra_data = [n for n in names if n.split("/", 1)[0].endswith(".data")]
        if extra_data:
            raise SystemExit(f"wheel has .data files, which this installer does not place: "
                         f"{extra_data[0]}")
        z.extractall(site)
    info = next(n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info"))
    content = (INSTALLER + "\n").encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    with open(os.path.join(site, info, "INSTALLER"), "wb") as f:
        f.write(content)
    with open(os.path.join(site, info, "RECORD"), "a") as f:
        f.write(f"{info}/INSTALLER,sha256={digest},{len(content)}\n")


def _pip(python, spec, *args):
    """pip, run from its own wheel in the wheelhouse, with no package index."""
    import glob
    import subprocess

    pips = sorted(glob.glob(os.path.join(spec["wheelhouse"], "pip-*.whl")))
    if not pips:
        raise SystemExit(f"the wheelhouse {spec['wheelhouse']} has no pip wheel")
    done = subprocess.run([python, os.path.join(pips[-1], "pip"), *args, "--quiet",
                           "--disable-pip-version-check"], stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise SystemExit(f"pip {args[0]} in the venv failed: {lines[-1] if lines else done.returncode}")


def make_venv(venv, spec):
    """A venv without pip holding the wheel's dependencies: pip installs the wheel with them from
    the wheelhouse, then removes the wheel itself (it goes to each environment's `site`)."""
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    target = spec["wheel"] + (f"[{spec['extra']}]" if spec.get("extra") else "")
    _pip(python, spec, "install", "--no-index", "--find-links", spec["wheelhouse"], target)
    _pip(python, spec, "uninstall", "--yes", spec["name"])
    return python


def ready(path, build):
    """Build `path` unless it is marked ready; under a lock, marked last. True if built."""
    if os.path.exists(os.path.join(path, READY)):
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(path, READY)):  # somebody finished it meanwhile
            return False
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        build(path)
        open(os.path.join(path, READY), "w").close()
        return True


def main(spec):
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    result = {"version": version, "python": sys.executable, "deps_installed": False}
    if spec["mode"] == "venv":
        # keyed by the dependency set, not by our wheel: new code reuses the venv
        venv = os.path.join(spec["envs"], f"venv-{spec['deps']}-py{version}-{spec['flavour']}")
        result["deps_installed"] = ready(venv, lambda path: make_venv(
            os.path.join(path, "venv"), spec))
        result["python"] = os.path.join(venv, "venv", "bin", "python")
    env = os.path.join(spec["envs"], f"{spec['digest']}-py{version}-{spec['flavour']}")
    result["env"] = env
    result["installed"] = ready(env, lambda path: unpack_wheel(spec["wheel"],
                                                               os.path.join(path, "site")))
    print(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
