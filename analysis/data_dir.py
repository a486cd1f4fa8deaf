"""Where the papers' reference measurements live (``analysis/reference_data/``, Apache-2.0,
attribution in its README): one fact, read by the analyses, the simulator's fits and the
revocation models. A module of its own, without pandas, so the orchestrator's start does not
pay for the analysis stack to learn a path."""

from pathlib import Path

REFERENCE_DIR = Path(__file__).resolve().parent / "reference_data"
