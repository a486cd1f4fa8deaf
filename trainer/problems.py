"""Problem registry: datasets as in-memory arrays plus tf.data pipelines for train and eval.

Every problem loads numpy arrays on the host that builds the pipeline (the chief for
training, the evaluator for evaluation) and ships them into the per-worker dataset function,
so workers need no data files. No problem downloads anything: trainer/data.py fetches the
files into a cache beforehand (the orchestrator's data step, or `python -m trainer.data fetch`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.data import cache_root
from trainer.datasets import find_cifar_files
from trainer.registry import Registry

if TYPE_CHECKING:
    import numpy as np
# numpy is imported by the loaders, not here: the orchestrator reads this registry (names,
# data_dir needs) before it starts the roles, and numpy was 0.1 s of that critical path.

SHUFFLE_BUFFER = 10_000
CIFAR_SIDE = 32
CIFAR_RECORD_PIXELS = 3 * CIFAR_SIDE * CIFAR_SIDE  # 3072 bytes, channel-major (R, G, B planes)


@dataclass
class Arrays:
    """A problem's data: NHWC images and int32 labels.

    CIFAR images stay uint8 with per-channel `mean`/`std` applied inside the pipeline: the
    arrays are embedded in the dataset function shipped to each worker, and uint8 keeps the
    50k-image train split at 150 MB instead of 600 MB.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    augment: bool = False  # pad-4 random crop + horizontal flip on the train split
    num_classes: int = 10
    mean: np.ndarray | None = None  # per-channel, applied after casting to float32
    std: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


@dataclass(frozen=True)
class Problem:
    """A registered problem; `load(data_dir, seed)` returns its Arrays."""

    name: str
    load: Callable[[str | None, int], Arrays]
    requires_data_dir: bool
    description: str = ""
    defaults: dict = field(default_factory=dict)


_PROBLEMS: Registry[Problem] = Registry("problem")


def register_problem(name: str, requires_data_dir: bool, description: str = "") -> Callable:
    """Decorator: register `load(data_dir, seed) -> Arrays` under `name`."""

    def wrap(load: Callable[[str | None, int], Arrays]) -> Callable:
        assert name not in _PROBLEMS, f"problem {name!r} registered twice"
        _PROBLEMS.register(name, Problem(name, load, requires_data_dir, description))
        return load

    return wrap


def list_problems() -> list[str]:
    return _PROBLEMS.names()


def get_problem(name: str) -> Problem:
    """The registered problem; UnknownNameError (a ValueError) listing the valid names."""
    return _PROBLEMS.get(name)


# --- tf.data pipelines -----------------------------------------------------------------------

def train_dataset(arrays: Arrays, batch_size: int, seed: int | None = None):
    """Shuffled, augmented, repeated, batched train split (a `tf.data.Dataset`).

    Under ParameterServerStrategy the dataset function is traced once on the chief and run
    on every worker, so a fixed shuffle seed would give every worker the *same* order (BSP
    would then average identical gradients). Leave `seed=None` there; a seed is for the
    single-process baseline and for tests.
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train))
    ds = ds.shuffle(min(SHUFFLE_BUFFER, len(arrays.y_train)), seed=seed,
                    reshuffle_each_iteration=True).repeat()
    ds = ds.map(_normaliser(arrays), num_parallel_calls=tf.data.AUTOTUNE)
    if arrays.augment:
        ds = ds.map(_augment, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def eval_dataset(arrays: Arrays, batch_size: int = 500):
    """The held-out split, one pass, no augmentation."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((arrays.x_test, arrays.y_test))
    ds = ds.map(_normaliser(arrays), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _normaliser(arrays: Arrays) -> Callable:
    import tensorflow as tf

    mean = None if arrays.mean is None else tf.constant(arrays.mean, tf.float32)
    std = None if arrays.std is None else tf.constant(arrays.std, tf.float32)

    def normalise(image, label):
        image = tf.cast(image, tf.float32)
        if mean is not None:
            image = (image - mean) / std
        return image, label

    return normalise


def _augment(image, label):
    import tensorflow as tf

    h, w, c = image.shape
    padded = tf.image.pad_to_bounding_box(image, 4, 4, h + 8, w + 8)
    image = tf.image.random_crop(padded, (h, w, c))
    return tf.image.random_flip_left_right(image), label


# --- digits: scikit-learn's bundled 8x8 digits (offline) -------------------------------------

@register_problem("digits", requires_data_dir=False,
                  description="scikit-learn 8x8 digits, 1797 images, 10 classes")
def load_digits(data_dir: str | None = None, seed: int = 0) -> Arrays:
    """8x8x1 images in [0, 1]; a stratified 80/20 split that depends only on `seed`.

    The split is kept in the data cache (`digits_split_cache`): importing scikit-learn for it
    costs about 2 CPU s in the chief and in the evaluator, on the start-up's critical path.
    """
    import numpy as np

    cached = digits_split_cache(seed)
    try:
        with np.load(cached) as z:
            return Arrays(z["x_train"], z["y_train"], z["x_test"], z["y_test"], augment=False,
                          num_classes=10)
    except (OSError, ValueError, KeyError):
        pass  # not cached yet (or damaged): split once more and cache it
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    y = bunch.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y)
    with contextlib.suppress(OSError):  # a read-only cache only costs the next run the import
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{cached.stem}.{os.getpid()}.part.npz")
        np.savez(partial, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
        partial.replace(cached)  # atomic: a concurrent reader sees all of it or nothing
    return Arrays(x_train, y_train, x_test, y_test, augment=False, num_classes=10)


def digits_split_cache(seed: int) -> Path:
    """The cached split for `seed`, keyed by scikit-learn's version (its split may change)."""
    from importlib.metadata import PackageNotFoundError, version


    try:
        sklearn_version = version("scikit-learn")
    except PackageNotFoundError:
        sklearn_version = "none"
    return cache_root() / "digits" / f"split-seed{seed}-sklearn{sklearn_version}.npz"


# --- synthetic: random images for throughput tests -------------------------------------------

SYNTHETIC_SHAPE = (32, 32, 3)
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 2048, 512


@register_problem("synthetic", requires_data_dir=False,
                  description="random 32x32x3 images, 10 classes (throughput only)")
def load_synthetic(data_dir: str | None = None, seed: int = 0, shape: tuple[int, ...] =
                   SYNTHETIC_SHAPE, num_classes: int = SYNTHETIC_CLASSES) -> Arrays:
    """Random normal images with random labels: accuracy means nothing, speed does."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return Arrays(
        rng.standard_normal((SYNTHETIC_TRAIN, *shape), dtype=np.float32),
        rng.integers(0, num_classes, SYNTHETIC_TRAIN, dtype=np.int32),
        rng.standard_normal((SYNTHETIC_TEST, *shape), dtype=np.float32),
        rng.integers(0, num_classes, SYNTHETIC_TEST, dtype=np.int32),
        augment=False, num_classes=num_classes)


# --- CIFAR-10 / CIFAR-100: the standard binary or python-pickle files ------------------------

def read_cifar_bin(path: Path, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary CIFAR: records of `label_bytes` label bytes then 3072 pixel bytes.

    CIFAR-100 has two label bytes (coarse, fine); the last one (fine) is the label.
    Returns uint8 NHWC images and int32 labels.
    """
    import numpy as np

    record = label_bytes + CIFAR_RECORD_PIXELS
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % record:
        raise ValueError(f"{path}: size {raw.size} is not a multiple of the {record}-byte record")
    raw = raw.reshape(-1, record)
    labels = raw[:, label_bytes - 1].astype(np.int32)
    images = raw[:, label_bytes:].reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1)
    return images, labels


def read_cifar_pickle(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Python-pickle CIFAR: a dict with b"data" (N x 3072 uint8) and the label list."""
    import numpy as np

    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    images = data.reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1)
    return images, np.asarray(batch[label_key], dtype=np.int32)


def load_cifar(problem: str, data_dir: str | None, num_classes: int) -> Arrays:
    """Read either CIFAR format; per-channel statistics come from the train split."""
    import numpy as np

    train_paths, test_paths, fmt, label = find_cifar_files(problem, data_dir)
    read = read_cifar_bin if fmt == "bin" else read_cifar_pickle

    def read_all(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
        parts = [read(p, label) for p in paths]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    x_train, y_train = read_all(train_paths)
    x_test, y_test = read_all(test_paths)
    assert y_train.max() < num_classes, (
        f"{problem}: label {y_train.max()} >= {num_classes} classes; wrong files?")
    pixels = x_train.reshape(-1, 3)
    mean = pixels.mean(axis=0, dtype=np.float64).astype(np.float32)
    std = (pixels.std(axis=0, dtype=np.float64) + 1e-6).astype(np.float32)
    return Arrays(x_train, y_train, x_test, y_test, augment=True, num_classes=num_classes,
                  mean=mean, std=std)


@register_problem("image_cifar10", requires_data_dir=True,
                  description="CIFAR-10 from the binary or python files under data_dir")
def load_cifar10(data_dir: str | None, seed: int = 0) -> Arrays:
    return load_cifar("image_cifar10", data_dir, 10)


@register_problem("image_cifar100", requires_data_dir=True,
                  description="CIFAR-100 (fine labels) from the binary or python files")
def load_cifar100(data_dir: str | None, seed: int = 0) -> Arrays:
    return load_cifar("image_cifar100", data_dir, 100)
