"""Where the orchestrator finds its own files: the config tree, the experiments, reference data."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_ROOT / "conf"
EXPERIMENTS_DIR = PROJECT_ROOT / "experiments"
REFERENCE_DATA_DIR = PROJECT_ROOT / "analysis" / "reference_data"
