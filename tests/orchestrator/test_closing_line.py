"""The run's closing line says what could not be confirmed stopped, and how to stop it."""

from __future__ import annotations

from pathlib import Path

from orchestrator.__main__ import _leftovers_note
from provisioning.journal import JOURNAL_FILE, Journal


def test_closing_line_names_unconfirmed_leftovers_and_the_release_command(tmp_path: Path):
    journal = Journal(tmp_path / JOURNAL_FILE)
    for pgid in (101, 102):
        journal.record_process_group(backend="ssh", host_id=f"h{pgid}", address="10.0.0.7",
                                     pid=pgid, pgid=pgid, argv=["python", "-m", "trainer"])
    journal.record_process_group_released(backend="ssh", host_id="h102", address="10.0.0.7",
                                          pgid=102)
    note = _leftovers_note(tmp_path)
    assert "1 resource(s) on 10.0.0.7 not confirmed stopped" in note, note
    assert note.endswith(f"run python -m orchestrator.release {tmp_path}"), note
    journal.record_process_group_released(backend="ssh", host_id="h101", address="10.0.0.7",
                                          pgid=101)
    assert _leftovers_note(tmp_path) == ""  # everything confirmed: the line says nothing
