"""Runs ON an SSH machine, by the machine's interpreter: makes or reuses one trainer environment.

This file is not imported by the orchestrator: `provisioning.ssh.setup` sends its text as one
`python -c` command (stdlib only), so a machine's whole setup costs one remote
command: each command starts the login shell, which on lab servers often sources a slow
`~/.bashrc` (conda or pyenv init), and pip alone costs a second of CPU per host. The argument
is a JSON object:

- `envs`: folder of the environments; `digest`: the wheel's content digest; `flavour`: a short
  hash of the interpreter and extra; `wheel`: the wheel's path on this machine (already copied);
- `mode`: `site` (the interpreter already has the trainer's dependencies: the wheel is
  unpacked into `<env>/site`, which the trainer gets on PYTHONPATH; no pip, no bytecode
  compilation) or `venv` (a venv without pip; pip, run from the wheelhouse's own pip wheel,
  installs the wheel and its dependencies from `wheelhouse` with no package index);
- `extra`: the optional-dependency group (`venv` mode).

The environment is named `<digest>-py<X.Y>-<flavour>` and marked ready last, under an `flock`
on `<env>.lock`, so concurrent runs never see half an environment and a second run installs
nothing. Prints one JSON line: `{"env": path, "version": "X.Y", "installed": bool}`.
"""

import base64
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

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


def make_venv(env, spec):
    """A venv without pip, filled by the wheelhouse's pip from the wheelhouse only."""
    venv = os.path.join(env, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    pips = sorted(glob.glob(os.path.join(spec["wheelhouse"], "pip-*.whl")))
    if not pips:
        raise SystemExit(f"the wheelhouse {spec['wheelhouse']} has no pip wheel")
    target = spec["wheel"] + (f"[{spec['extra']}]" if spec.get("extra") else "")
    subprocess.run([os.path.join(venv, "bin", "python"), os.path.join(pips[-1], "pip"),
                    "install", "--quiet", "--no-index", "--disable-pip-version-check",
                    "--find-links", spec["wheelhouse"], target], check=True)


def main(spec):
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    env = os.path.join(spec["envs"], f"{spec['digest']}-py{version}-{spec['flavour']}")
    result = {"env": env, "version": version, "installed": False}
    if not os.path.exists(os.path.join(env, READY)):
        os.makedirs(spec["envs"], exist_ok=True)
        with open(env + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(os.path.join(env, READY)):  # nobody finished it meanwhile
                shutil.rmtree(env, ignore_errors=True)
                os.makedirs(env)
                if spec["mode"] == "site":
                    unpack_wheel(spec["wheel"], os.path.join(env, "site"))
                else:
                    make_venv(env, spec)
                open(os.path.join(env, READY), "w").close()
                result["installed"] = True
    print(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
