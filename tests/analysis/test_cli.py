"""``python -m analysis``: dispatch, help, and one-line errors for user mistakes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analysis import cli


def test_module_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "analysis", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for command in cli.COMMANDS:
        assert command in out


def test_cli_report_and_errors(run_dir: Path, tmp_path: Path, capsys) -> None:
    assert cli.main(["report", str(run_dir), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "index.html").exists()
    assert cli.main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_help_and_unknown(capsys) -> None:
    assert cli.main(["--help"]) == 0
    assert "syncswitch" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["bogus"])
    assert exc.value.code == 2


@pytest.mark.parametrize("command", ["lifetimes", "cost", "syncswitch"])
def test_cli_subcommands(command: str, capsys) -> None:
    assert cli.main([command]) == 0
    assert capsys.readouterr().out.strip()
