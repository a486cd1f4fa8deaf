"""Where the orchestrator finds its own files: the config tree, the experiments, reference data."""

from provisioning.checkout import PROJECT_ROOT

CONF_DIR = PROJECT_ROOT / "conf"
EXPERIMENTS_DIR = PROJECT_ROOT / "experiments"
REFERENCE_DATA_DIR = PROJECT_ROOT / "analysis" / "reference_data"
