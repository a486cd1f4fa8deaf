"""Runs ON an SSH machine, by the machine's interpreter: makes or reuses one trainer environment.

This file is not imported by the orchestrator: `provisioning.ssh.setup` sends its text as one
`python -c` command (stdlib only, and old enough Python to say "unsupported" on any `python3`),
so a machine's whole setup costs one remote command: each command starts the login shell, which
on lab servers often sources a slow `~/.bashrc` (conda or pyenv init), and pip alone costs a
second of CPU per host. The argument is a JSON object:

- `envs`: folder of the environments; `digest`: the wheel's content digest; `flavour`: a short
  hash of the interpreter and extra; `wheel`: the wheel's path on this machine (already copied);
- `mode`: `site` (the interpreter already has the trainer's dependencies), `index` or
  `wheelhouse`: a venv without pip, named by `deps` (a digest of the hosts' dependency set) and
  the Python minor, is made once with a supported interpreter (`check`: the CPython minors and
  the machine/glibc the runtime's wheels need; `python3` or else a `python3.X` on PATH or in
  ~/.local/bin, where `uv python install` puts one) and pip,
  run from its own wheel, installs `requirements` into it: from `index_url` (the pip wheel is
  fetched from that index too, so nothing large comes from the orchestrator), or with no index
  from `wheelhouse/<key>`, a folder the orchestrator fills for this host's Python and platform
  (the script answers `need_wheelhouse` with the key when it is not complete);
- in every mode the wheel itself is unpacked into `<env>/site` (no pip, no bytecode
  compilation), which the trainer gets on PYTHONPATH, so new code costs an unpack, not a venv.

The environment is named `<digest>-py<X.Y>-<flavour>` and marked ready last, under an `flock`
on `<env>.lock`, so concurrent runs never see half an environment and a second run installs
nothing. Prints one JSON line: `{"status": "ready", "env": path, "python": the interpreter to run
the trainer with, "version": "X.Y", "installed": bool, "deps_installed": bool}`, or
`{"status": "unsupported", ...}` (no interpreter or platform fits: nothing was changed) or
`{"status": "need_wheelhouse", "key": ..., ...}`.
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


def _pip(python, pip_wheel, *args):
    """pip, run from its own wheel (the venv has no pip), into `python`'s venv; pip_wheel
    None: the venv's own pip."""
    import subprocess

    run = [python, os.path.join(pip_wheel, "pip")] if pip_wheel else [python, "-m", "pip"]
    done = subprocess.run([*run, *args, "--quiet", "--disable-pip-version-check", "--no-input"],
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise SystemExit(f"pip {args[0]} in the venv failed: {lines[-1] if lines else done.returncode}")


def _wheelhouse_pip(folder):
    import glob

    pips = sorted(glob.glob(os.path.join(folder, "pip-*.whl")))
    if not pips:
        raise SystemExit(f"the wheelhouse {folder} has no pip wheel")
    return pips[-1]


def _index_pip(index_url, cache, minor):
    """pip's newest wheel for this Python from the index's simple page (PEP 503), kept in
    `cache`: the host needs neither pip nor ensurepip, and only this index. None when the
    index serves no pip (a private index of only the set): the venv's ensurepip then."""
    import hashlib
    import html
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    url = index_url.rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={
                "Accept": "text/html"}), timeout=60) as response:
            page, base = response.read().decode("utf-8", "replace"), response.geturl()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise SystemExit(f"the package index {index_url} answered {error.code} for {url}: "
                         f"set provider.index_url to an index this host can use") from None
    except Exception as error:  # every way of not reaching it says the same to the user
        raise SystemExit(f"the package index {index_url} is not reachable from this host "
                         f"({error}): set provider.index_url to an index it reaches, or "
                         f"provider.wheelhouse to install without one") from None
    found = []
    for attrs, text in re.findall(r"<a\s([^>]*)>([^<]*)</a>", page):
        match = re.fullmatch(r"pip-(\d+(?:\.\d+)*)-py3-none-any\.whl", text.strip())
        href = re.search(r'href="([^"]*)"', attrs)
        needs = re.search(r'data-requires-python="&gt;=\s*3\.(\d+)', attrs)
        if match and href and "data-yanked" not in attrs and not (needs and int(needs[1]) > minor):
            found.append((tuple(int(x) for x in match[1].split(".")), text.strip(),
                          html.unescape(href[1])))
    if not found:
        return None
    _, name, href = max(found)
    target = os.path.join(cache, name)
    if os.path.exists(target):
        return target
    link, _, fragment = urllib.parse.urljoin(base, href).partition("#")
    os.makedirs(cache, exist_ok=True)
    part = target + f".part{os.getpid()}"
    with urllib.request.urlopen(link, timeout=120) as response, open(part, "wb") as f:
        data = response.read()
        f.write(data)
    if fragment.startswith("sha256=") and hashlib.sha256(data).hexdigest() != fragment[7:]:
        os.unlink(part)
        raise SystemExit(f"{link}: the download does not match the index's sha256")
    os.replace(part, target)
    return target


def make_venv(venv, base_python, spec, minor):
    """A venv without pip holding the hosts' dependency set (`requirements`), installed by pip
    run from its own wheel: from the index, or from the wheelhouse with no index."""
    import subprocess

    subprocess.run([base_python, "-m", "venv", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    # --only-binary: a host never compiles (no compilers on a cloud image); a missing wheel is
    # pip's one-line "no matching distribution"; --no-cache-dir: the venv is the cache;
    # --no-compile: no bytecode for all of TensorFlow's 20,000 files up front (time and disk),
    # Python caches what the trainer imports when it first imports it
    args = ["install", "--only-binary=:all:", "--no-cache-dir", "--no-compile",
            *spec["requirements"]]
    if spec["mode"] == "index":
        import urllib.parse

        url = spec["index_url"]
        pip = _index_pip(url, os.path.join(spec["envs"], "pip"), minor)
        if pip is None:  # no pip on that index: the venv's own, from the image's ensurepip
            done = subprocess.run([python, "-m", "ensurepip", "--default-pip"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                raise SystemExit(f"the package index {url} serves no pip, and this host's "
                                 f"Python has no ensurepip (python3-venv) to make one")
        # an http:// index (a lab's mirror) was chosen as it is: pip refuses one unless trusted
        parts = urllib.parse.urlsplit(url)
        trust = ["--trusted-host", parts.hostname] if parts.scheme == "http" else []
        _pip(python, pip, *args[:3], "--index-url", url, *trust, *args[3:])
    else:
        folder = spec["wheelhouse_dir"]
        _pip(python, _wheelhouse_pip(folder), *args[:3], "--no-index", "--find-links", folder,
             *args[3:])
    return python


def _glibc():
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return tuple(int(x) for x in version.split(".")[:2]) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None  # not glibc (musl) or not Linux


def _interpreter(check):
    """(path, minor) of an interpreter whose minor the runtime installs on, this one first,
    then `python3.X` on PATH or in ~/.local/bin (where `uv python install 3.X` puts a managed
    CPython; a non-interactive login's PATH often lacks that folder) newest first; None if there
    is none."""
    low, high = check["minors"]
    if sys.version_info[0] == 3 and low <= sys.version_info[1] <= high:
        return sys.executable, sys.version_info[1]
    import subprocess

    for minor in range(high, low - 1, -1):
        folders = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
        for folder in [*folders, os.path.expanduser("~/.local/bin")]:
            path = os.path.join(folder or ".", f"python3.{minor}")
            if os.access(path, os.X_OK) and not os.path.isdir(path):
                # asked, not trusted by name: a pyenv shim answers for versions it lacks
                done = subprocess.run([path, "-S", "-c", "import sys; print(sys.version_info[1])"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
                if done.returncode == 0 and done.stdout.strip() == str(minor):
                    return path, minor
    return None


def _platform_fits(check):
    glibc = _glibc()
    return (sys.platform.startswith("linux") and os.uname().machine == check["machine"]
            and glibc is not None and glibc >= tuple(check["glibc"])), glibc


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
    result = {"status": "ready", "version": version, "python": sys.executable,
              "deps_installed": False}
    if spec["mode"] != "site":
        check = spec["check"]
        fits, glibc = _platform_fits(check)
        found = _interpreter(check) if fits else None
        if found is None:
            print(json.dumps({"status": "unsupported", "version": version,
                              "platform": f"{sys.platform} {os.uname().machine}",
                              "glibc": ".".join(map(str, glibc)) if glibc else "none"}))
            return
        base, minor = found
        version = f"3.{minor}"
        # keyed by the dependency set, not by our wheel: new code reuses the venv
        venv = os.path.join(spec["envs"], f"venv-{spec['deps']}-py{version}-{spec['flavour']}")
        if spec["mode"] == "wheelhouse" and not os.path.exists(os.path.join(venv, READY)):
            key = f"{spec['deps']}-cp3{minor}-glibc{glibc[0]}.{glibc[1]}-{check['machine']}"
            spec["wheelhouse_dir"] = os.path.join(spec["wheelhouse"], key)
            if not os.path.exists(os.path.join(spec["wheelhouse_dir"], READY)):
                print(json.dumps({"status": "need_wheelhouse", "key": key, "minor": minor,
                                  "glibc": list(glibc), "machine": check["machine"]}))
                return
        result["deps_installed"] = ready(venv, lambda path: make_venv(
            os.path.join(path, "venv"), base, spec, minor))
        result["python"] = os.path.join(venv, "venv", "bin", "python")
        result["version"] = version
    env = os.path.join(spec["envs"], f"{spec['digest']}-py{result['version']}-{spec['flavour']}")
    result["env"] = env
    result["installed"] = ready(env, lambda path: unpack_wheel(spec["wheel"],
                                                               os.path.join(path, "site")))
    print(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
