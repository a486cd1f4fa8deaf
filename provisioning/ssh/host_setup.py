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

import fcntl
import json
import os
import struct
import sys
import zlib

# This script's start is a part of every host's setup, and it runs with `python -S` (no
# site-packages scan: 35 ms of CPU with a venv's .pth files). Heavier modules are imported
# where they are needed: zipfile alone (pathlib, shutil, importlib.util, re) cost 30 ms of
# CPU per host, so a wheel is read by `_members` below; glob and subprocess only when a venv
# is built, shutil when an environment is rebuilt.

READY = ".ready"
INSTALLER = "transient-orchestrator"


def unpack_wheel(wheel, site):
    """Install a pure-Python wheel by unpacking it (what pip does for one, minus compiling),
    recording the installer in `.dist-info` and adding it to RECORD."""
    with open(wheel, "rb") as f:
        data = f.read()
    members = _members(data)
    if members is None:  # a zip feature the small reader leaves to zipfile
        import zipfile

        with zipfile.ZipFile(wheel) as z:
            members = [(n, lambda n=n: z.read(n)) for n in z.namelist()]
            _extract(members, site)
    else:
        _extract(members, site)
    names = [name for name, _ in members]
    info = next(n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info"))
    import base64
    import hashlib

    content = (INSTALLER + "\n").encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    with open(os.path.join(site, info, "INSTALLER"), "wb") as f:
        f.write(content)
    with open(os.path.join(site, info, "RECORD"), "a") as f:
        f.write(f"{info}/INSTALLER,sha256={digest},{len(content)}\n")


def _extract(members, site):
    extra_data = [n for n, _ in members if n.split("/", 1)[0].endswith(".data")]
    if extra_data:
        raise SystemExit(f"wheel has .data files, which this installer does not place: "
                         f"{extra_data[0]}")
    for name, read in members:
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "\\" in name:
            raise SystemExit(f"wheel member {name!r} would be written outside the environment")
        path = os.path.join(site, *parts)
        if name.endswith("/"):
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(read())


def _members(data):
    """[(name, read)] of the zip archive in `data` (stored or deflated members, CRC checked),
    or None when it uses what this reader does not (zip64, encryption, other compression)."""
    end = data.rfind(b"PK\x05\x06")
    if end < 0 or len(data) - end < 22:
        return None
    _, _, _, _, count, _, offset, _ = struct.unpack_from("<4s4H2IH", data, end)
    members = []
    for _ in range(count):
        if data[offset:offset + 4] != b"PK\x01\x02":
            return None
        (_, _, _, flags, method, _, _, crc, csize, size, name_len, extra_len, comment_len,
         _, _, _, local) = struct.unpack_from("<4s6H3I5HII", data, offset)
        if flags & 1 or method not in (0, 8) or 0xFFFFFFFF in (csize, size, local):
            return None
        name = data[offset + 46:offset + 46 + name_len].decode("utf-8" if flags & 0x800
                                                               else "cp437")
        offset += 46 + name_len + extra_len + comment_len
        if data[local:local + 4] != b"PK\x03\x04":
            return None
        skip = struct.unpack_from("<2H", data, local + 26)
        start = local + 30 + skip[0] + skip[1]
        members.append((name, lambda s=start, c=csize, m=method, n=size, k=crc, name=name:
                        _inflate(data[s:s + c], m, n, k, name)))
    return members


def _inflate(raw, method, size, crc, name):
    out = zlib.decompress(raw, -15) if method == 8 else raw
    if len(out) != size or zlib.crc32(out) != crc:
        raise SystemExit(f"wheel member {name!r} is corrupt (size or CRC mismatch)")
    return out


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
        import shutil

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
