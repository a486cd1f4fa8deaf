"""The data step of a run: the problem's files are here before anything is provisioned.

``job.data_dir`` wins when given (it must hold the files). Left unset, a file-backed problem
reads its dataset from the per-user cache (``data_cache``, ``$TRANSIENT_DATA_CACHE``, or
``~/.cache/transient-orchestrator/datasets``), downloaded into it first when missing
(``trainer/data.py``); the run's trainer spec then names that folder. A ``gs://BUCKET/PREFIX``
data_dir is downloaded once into the same cache (``<cache>/gs/BUCKET/PREFIX``, only what changed
on later runs) and read from there: a URL is fetched by the backend that lists its scheme
(`Provider.fetch_dataset`; gs:// by gce, whichever backend runs the hosts). Remote hosts get
the folder from the deployer (:func:`stage_to` per machine that reads it), through the launch
contract's ``copy``.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ExperimentConfig
from provisioning.base import Cluster, Host, HostRunner, Provider, ProvisionError, Role, url_scheme
from provisioning.registry import dataset_reader

STAGED_DATA_DIR = "data"  # on a remote host, relative to its work dir
# The roles that read the files: they load the arrays and ship them into each worker's dataset
# function (trainer/problems.py), so parameter servers and workers need no copy.
READING_ROLES = (Role.CHIEF, Role.EVALUATOR)


class DataError(ConfigError):
    """The dataset could not be obtained: one line and exit 2 like a config error, since
    nothing was started and the user must act (go online, or place the files by hand)."""

    def __init__(self, message: str) -> None:
        super().__init__("job.data_dir", message)

    def line(self) -> str:
        return f"data error: {self.problem}"


def _dataset(cfg: ExperimentConfig):  # -> trainer.data.Dataset | None
    """The downloadable dataset the run would read from the cache, None when it reads none."""
    from trainer import data
    from trainer.problems import get_problem

    if cfg.job.data_dir or not get_problem(cfg.job.problem).requires_data_dir:
        return None
    return data.dataset_for_problem(cfg.job.problem)


def describe(cfg: ExperimentConfig) -> str | None:
    """The dry run's data line: where the files are and how big, or what will be fetched."""
    from rich.markup import escape

    from orchestrator.config.validation import validate_data_dir
    from trainer import data

    try:
        validate_data_dir(cfg)
    except ConfigError as err:
        return f"[yellow]{escape(err.line())}[/yellow] (the run stops there)"
    if cfg.job.data_dir and url_scheme(cfg.job.data_dir):
        folder = _fetch(cfg, download=False)
        return (f"{cfg.job.problem} from {cfg.job.data_dir}: the run first downloads what "
                f"{folder} lacks")
    if cfg.job.data_dir:
        folder = Path(cfg.job.data_dir).expanduser()
        return f"{cfg.job.problem} from job.data_dir {folder} " \
               f"({data.human_bytes(data.folder_bytes(folder))})"
    ds = _dataset(cfg)
    if ds is None:
        return None
    root = data.cache_root(cfg.data_cache)
    folder = data.cached_folder(ds, root)
    if data.holds_files(ds.problem, folder):
        return f"{ds.problem} cached in {folder} ({data.human_bytes(data.folder_bytes(folder))})"
    archive = ds.archive()
    return (f"{ds.problem} not cached: the run first downloads {archive.filename} "
            f"({data.human_bytes(archive.size)}) from {archive.source_url()} into {folder}")


def prepare(cfg: ExperimentConfig, console=None) -> Path | None:
    """Make the files available and point ``cfg.job.data_dir`` at them; fetch when missing.

    Raises ConfigError for a bad ``job.data_dir``, DataError when the download fails. Returns
    the folder the run reads (None for problems without files).
    """
    from orchestrator.config.validation import validate_data_dir
    from trainer import data

    validate_data_dir(cfg)
    if cfg.job.data_dir:  # absolute: the roles run in their hosts' work dirs
        given = _fetch(cfg)
        cfg.job.data_dir = str(given)
        return given
    ds = _dataset(cfg)
    if ds is None:
        return None
    try:
        folder = data.fetch(ds, data.cache_root(cfg.data_cache), console=console,
                            progress=cfg.progress)
    except data.FetchError as err:
        raise DataError(str(err)) from None
    cfg.job.data_dir = str(folder)
    return folder


def _fetch(cfg: ExperimentConfig, download: bool = True) -> Path:
    """The local folder of a given ``job.data_dir``: a folder as it is, a URL (``gs://...``)
    through the backend that reads its scheme (`Provider.fetch_dataset`), downloaded into the
    data cache as needed (`download` False: where it would be). DataError when the URL cannot
    be read or does not hold the problem's files."""
    from trainer import data

    url = str(cfg.job.data_dir)
    reader = dataset_reader(url, cfg.provider.name)
    try:
        folder = reader.fetch_dataset(url, data.cache_root(cfg.data_cache), download)
    except ProvisionError as err:
        raise DataError(f"cannot download {url}: {err}") from None
    if download and url_scheme(url) and not data.holds_files(cfg.job.problem, folder):
        raise DataError(f"{url} does not hold the {cfg.job.problem} files (downloaded into "
                        f"{folder}; see python -m trainer.data list)")
    return folder


def reads_data(cluster: Cluster, host: Host) -> bool:
    """Whether a role on `host`'s machine reads the dataset (colocated roles share a copy)."""
    return any(h.machine == host.machine and h.role in READING_ROLES for h in cluster.hosts)


def staged_path(local_dir: Path) -> str:
    """Where a staged dataset lies on a host: relative to its work dir (the trainer's cwd
    there), so one spec serves every host."""
    return str(Path(STAGED_DATA_DIR) / local_dir.name)


def stage_to(runner: HostRunner, local_dir: Path) -> str:
    """Copy ``local_dir`` to the runner's machine; returns :func:`staged_path`."""
    runner.copy(local_dir, Path(staged_path(local_dir)))
    return staged_path(local_dir)


def stage_dataset(provider: Provider, cluster: Cluster, local_dir: Path) -> str:
    """Copy ``local_dir`` onto every machine that reads it; the path to put in the spec.

    The deployer does this per machine when its hosts do not share this machine's files
    (:class:`orchestrator.runtime.deploy.Deployment`), also for replacement machines."""
    staged: set[str] = set()
    for host in cluster.hosts:
        if reads_data(cluster, host) and host.machine not in staged:
            staged.add(host.machine)
            stage_to(provider.runner(host), local_dir)
    return staged_path(local_dir)
