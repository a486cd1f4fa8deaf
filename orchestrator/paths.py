"""Where the orchestrator finds its own files: the config tree, the experiments, reference data.

They ship inside the installed package (wheel, sdist or editable install alike): the config tree
is the package ``orchestrator.conf`` (in the checkout, ``orchestrator/conf`` links to the
top-level ``conf/``, whose ``experiment`` links to ``experiments/``), which Hydra reads at
``pkg://orchestrator.conf``. The user's own experiments and config groups come first
(:mod:`orchestrator.user_repo`).
"""

from pathlib import Path

from analysis.data_dir import REFERENCE_DIR

_PACKAGE = Path(__file__).resolve().parent

#: The packaged config tree as a Hydra search-path entry (``hydra.main``'s config path).
CONF_PACKAGE = "orchestrator.conf"
CONF_SEARCH_PATH = f"pkg://{CONF_PACKAGE}"
#: The same tree as a folder (installed packages are folders: no zip imports here).
CONF_DIR = _PACKAGE / "conf"
#: The packaged example experiments (the ``experiment`` group of the packaged tree).
EXPERIMENTS_DIR = CONF_DIR / "experiment"
REFERENCE_DATA_DIR = REFERENCE_DIR  # the papers' measurements: analysis/data_dir.py
