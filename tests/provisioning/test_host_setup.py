"""provisioning/ssh/host_setup.py, the script a host's interpreter runs (`python -S -c`):
its own zip reader unpacks what zipfile would, refuses what it must, hands the rest to
zipfile, and a plain setup imports neither site-packages nor zipfile (the reasons are in the
script's header). Fast: no SSH, the script runs here as it runs on a host."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from provisioning.ssh import host_setup
from provisioning.ssh.setup import _HOST_SCRIPT

INFO = "demo-1.0.dist-info"


def make_wheel(path: Path, compression: int = zipfile.ZIP_DEFLATED,
               extra: dict[str, bytes] | None = None) -> Path:
    members = {"demo/__init__.py": b"VALUE = 1\n", "demo/sub/mod.py": b"x = 'h\xc3\xa9'\n" * 50,
               f"{INFO}/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
               f"{INFO}/RECORD": b"demo/__init__.py,,\n", **(extra or {})}
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr(zipfile.ZipInfo("demo/empty/"), b"")  # a directory entry
        stored = zipfile.ZipInfo("demo/stored.txt")  # one stored member among deflated ones
        z.writestr(stored, b"stored as is", compress_type=zipfile.ZIP_STORED)
        for name, content in members.items():
            z.writestr(name, content)
    return path


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2])
def test_unpack_matches_zipfile_and_records_the_installer(tmp_path, compression) -> None:
    """Deflated: the script's own reader; bzip2 (which it does not read): zipfile's."""
    wheel = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", compression)
    assert (host_setup._members(wheel.read_bytes()) is None) == (
        compression == zipfile.ZIP_BZIP2)
    expected = tmp_path / "expected"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(expected)
    site = tmp_path / "site"
    host_setup.unpack_wheel(str(wheel), str(site))
    got = tree(site)
    installer = got.pop(f"{INFO}/INSTALLER")
    assert installer == f"{host_setup.INSTALLER}\n".encode()
    record = got.pop(f"{INFO}/RECORD").decode().splitlines()
    assert record[-1].startswith(f"{INFO}/INSTALLER,sha256=")
    want = tree(expected)
    assert want.pop(f"{INFO}/RECORD").decode().splitlines() == record[:-1]
    assert got == want


def test_a_corrupt_member_or_a_path_outside_is_refused(tmp_path) -> None:
    wheel = make_wheel(tmp_path / "bad.whl", zipfile.ZIP_STORED)
    data = bytearray(wheel.read_bytes())
    at = data.index(b"VALUE = 1")
    data[at] = ord("W")  # same size, wrong CRC
    wheel.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="corrupt"):
        host_setup.unpack_wheel(str(wheel), str(tmp_path / "site"))
    evil = make_wheel(tmp_path / "evil.whl", extra={"../outside.py": b"x"})
    with pytest.raises(SystemExit, match="outside the environment"):
        host_setup.unpack_wheel(str(evil), str(tmp_path / "site2"))
    assert not (tmp_path / "outside.py").exists()


def test_a_setup_runs_without_site_packages_or_zipfile(tmp_path) -> None:
    """The command a host runs (setup.py adds -S), in `site` mode: the environment is made,
    marked ready, reused by a second call; zipfile and site were never imported."""
    wheel = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl")
    spec = {"envs": str(tmp_path / "envs"), "digest": "d" * 16, "flavour": "f" * 8,
            "wheel": str(wheel), "mode": "site", "wheelhouse": "", "extra": None,
            "name": "demo", "deps": "0" * 16}
    probe = _HOST_SCRIPT + "\nprint(json.dumps(sorted({'zipfile', 'site'} & set(sys.modules))))\n"
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-S", "-c", probe, json.dumps(spec)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        result_line, modules_line = done.stdout.strip().splitlines()[-2:]
        outputs.append(json.loads(result_line))
        assert json.loads(modules_line) == []
    first, second = outputs
    assert first["installed"] and not second["installed"]
    site = Path(first["env"]) / "site"
    assert (site / "demo" / "sub" / "mod.py").read_bytes() == b"x = 'h\xc3\xa9'\n" * 50
    assert (Path(first["env"]) / host_setup.READY).exists()


def test_an_unsupported_python3_finds_a_uv_managed_interpreter_in_local_bin(
        tmp_path, monkeypatch) -> None:
    """`uv python install 3.X` puts `python3.X` into ~/.local/bin, which a non-interactive SSH
    command's PATH usually lacks: the script looks there too, after PATH, and asks the
    interpreter its version (a name is not trusted). Here the running interpreter plays a
    host's unsupported `python3` (3.10) and this test's own Python is the managed one."""
    import types

    minor = sys.version_info[1]
    check = {"minors": [minor, minor]}
    monkeypatch.setattr(host_setup, "sys", types.SimpleNamespace(
        version_info=(3, minor - 1, 0), executable="/usr/bin/python3"))
    empty = tmp_path / "path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert host_setup._interpreter(check) is None  # nothing on PATH, no ~/.local/bin
    managed = tmp_path / "home" / ".local" / "bin" / f"python3.{minor}"
    managed.parent.mkdir(parents=True)
    liar = managed.with_name(f"python3.{minor + 1}")  # a name that lies is not taken
    liar.symlink_to(sys.executable)
    assert host_setup._interpreter({"minors": [minor + 1, minor + 1]}) is None
    managed.symlink_to(sys.executable)
    assert host_setup._interpreter(check) == (str(managed), minor)
