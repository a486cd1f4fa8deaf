"""The dataset registry: each file-backed problem's published archives (URL, checksum, size,
the folder they unpack to, the files its reader needs) and how to recognise those files in a
folder. Nothing here touches the network or the cache (trainer/data.py fetches and caches);
the trainer's readers (trainer/problems.py), the orchestrator's data step and config
validation ask it what a problem reads and whether a folder holds it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MIRROR_ENV = "TRANSIENT_DATA_MIRROR"  # base URL serving the archives under their file names


@dataclass(frozen=True)
class Archive:
    """One published archive: URL, the published MD5 and size, the folder it unpacks to, and
    the files in it that the reader needs (trainer/problems.py `load_cifar`)."""

    url: str
    md5: str
    size: int  # bytes, as published; for the progress bar and the dry run
    folder: str  # its single top-level folder
    fmt: str  # "bin" (fixed-size records) or "py" (pickled dicts)
    train: tuple[str, ...]  # the train files, in the folder
    test: tuple[str, ...]  # the test files
    label: int | bytes  # bin: label bytes per record (the last is the label); py: its key

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def source_url(self) -> str:
        """The URL to fetch: the canonical one, or ``$TRANSIENT_DATA_MIRROR/<file name>``."""
        mirror = os.environ.get(MIRROR_ENV)
        return f"{mirror.rstrip('/')}/{self.filename}" if mirror else self.url


@dataclass(frozen=True)
class Dataset:
    """A problem's downloadable data; the first archive is the one fetched by default."""

    name: str  # the cache sub-folder and the CLI's name
    problem: str  # the trainer.problems name whose reader reads it
    archives: tuple[Archive, ...]

    def archive(self, fmt: str | None = None) -> Archive:
        """The archive of format ``bin`` or ``py`` (None: the default, the first)."""
        if fmt is None:
            return self.archives[0]
        for a in self.archives:
            if a.fmt == fmt:
                return a
        raise ValueError(f"{self.name}: no {fmt!r} archive (formats: bin, py)")


# The published checksums and sizes (https://www.cs.toronto.edu/~kriz/cifar.html). The binary
# versions come first: read with np.fromfile, no unpickling of downloaded data.
_TORONTO = "https://www.cs.toronto.edu/~kriz"
DATASETS: dict[str, Dataset] = {
    "cifar10": Dataset("cifar10", "image_cifar10", (
        Archive(f"{_TORONTO}/cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530",
                170_052_171, "cifar-10-batches-bin", "bin",
                tuple(f"data_batch_{i}.bin" for i in range(1, 6)), ("test_batch.bin",), 1),
        Archive(f"{_TORONTO}/cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
                170_498_071, "cifar-10-batches-py", "py",
                tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), b"labels"),
    )),
    "cifar100": Dataset("cifar100", "image_cifar100", (
        Archive(f"{_TORONTO}/cifar-100-binary.tar.gz", "03b5dce01913d631647c71ecec9e9cb8",
                168_513_733, "cifar-100-binary", "bin", ("train.bin",), ("test.bin",), 2),
        Archive(f"{_TORONTO}/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
                169_001_437, "cifar-100-python", "py", ("train",), ("test",), b"fine_labels"),
    )),
}


def dataset_for(name: str) -> Dataset:
    """The dataset by its name (``cifar10``) or its problem's name (``image_cifar10``)."""
    for ds in DATASETS.values():
        if name in (ds.name, ds.problem):
            return ds
    valid = ", ".join(sorted(DATASETS))
    raise KeyError(f"unknown dataset {name!r} (valid: {valid})")


def dataset_for_problem(problem: str) -> Dataset | None:
    return next((ds for ds in DATASETS.values() if ds.problem == problem), None)


def find_cifar_files(problem: str, data_dir: str | None) -> tuple[list[Path], list[Path], str,
                                                                   object]:
    """Locate train/test files under `data_dir` or an archive's extracted sub-folder.

    Returns (train_paths, test_paths, format, label spec). Raises FileNotFoundError listing
    every layout that was tried, so the user sees which file names are expected.
    """
    archives = dataset_for(problem).archives
    if not data_dir:
        raise FileNotFoundError(f"{problem}: job.data_dir is required (a folder holding "
                                f"{' or '.join(a.folder for a in archives)})")
    root = Path(data_dir).expanduser()
    tried = []
    for a in archives:
        files = [*a.train, *a.test]
        for base in (root, root / a.folder):
            if all((base / f).is_file() for f in files):
                return [base / f for f in a.train], [base / f for f in a.test], a.fmt, a.label
        tried.append(f"{a.folder}/{{{','.join(files)}}}")
    raise FileNotFoundError(f"{problem}: no CIFAR files under {root}; expected {' or '.join(tried)}"
                            f" (in data_dir or in the named sub-folder)")


def holds_files(problem: str, folder: Path | str) -> bool:
    """True when ``folder`` (or its archive sub-folder) holds every file the reader needs."""
    try:
        find_cifar_files(problem, str(folder))
    except FileNotFoundError:
        return False
    return True
