"""CIFAR readers on small files written in exactly the real binary and pickle formats."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from trainer.problems import get_problem, train_dataset

PER_FILE = 6  # records per generated file


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    """Row-major NHWC uint8 images; the files store them channel-major (R, G, B planes)."""
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def _planes(images: np.ndarray) -> np.ndarray:
    return images.transpose(0, 3, 1, 2).reshape(len(images), 3072)


def write_cifar10_bin(root: Path, rng: np.random.Generator) -> dict[str, tuple]:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    truth = {}
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        images, labels = _images(rng, PER_FILE), rng.integers(0, 10, PER_FILE, dtype=np.uint8)
        records = np.concatenate([labels[:, None], _planes(images)], axis=1)
        (folder / name).write_bytes(records.astype(np.uint8).tobytes())
        truth[name] = (images, labels)
    return truth


def write_cifar100_bin(root: Path, rng: np.random.Generator) -> dict[str, tuple]:
    folder = root / "cifar-100-binary"
    folder.mkdir(parents=True)
    truth = {}
    for name in ("train.bin", "test.bin"):
        images = _images(rng, PER_FILE)
        coarse = rng.integers(0, 20, PER_FILE, dtype=np.uint8)
        fine = rng.integers(0, 100, PER_FILE, dtype=np.uint8)
        records = np.concatenate([coarse[:, None], fine[:, None], _planes(images)], axis=1)
        (folder / name).write_bytes(records.astype(np.uint8).tobytes())
        truth[name] = (images, fine)
    return truth


def write_cifar_pickle(root: Path, rng: np.random.Generator, hundred: bool) -> dict[str, tuple]:
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True)
    names = ["train", "test"] if hundred else [f"data_batch_{i}" for i in range(1, 6)] + [
        "test_batch"]
    truth = {}
    for name in names:
        images = _images(rng, PER_FILE)
        labels = rng.integers(0, 100 if hundred else 10, PER_FILE).tolist()
        batch = {b"batch_label": name.encode(), b"data": _planes(images),
                 b"filenames": [b"x.png"] * PER_FILE}
        if hundred:
            batch[b"fine_labels"] = labels
            batch[b"coarse_labels"] = [lab // 5 for lab in labels]
        else:
            batch[b"labels"] = labels
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)  # the real files are Python 2 pickles
        truth[name] = (images, np.asarray(labels))
    return truth


def _check(arrays, truth: dict[str, tuple], test_name: str, num_classes: int) -> None:
    train_names = [n for n in truth if n != test_name]
    want_train = np.concatenate([truth[n][0] for n in train_names])
    np.testing.assert_array_equal(arrays.x_train, want_train)
    np.testing.assert_array_equal(arrays.y_train,
                                  np.concatenate([truth[n][1] for n in train_names]))
    np.testing.assert_array_equal(arrays.x_test, truth[test_name][0])
    np.testing.assert_array_equal(arrays.y_test, truth[test_name][1])
    assert arrays.input_shape == (32, 32, 3) and arrays.num_classes == num_classes
    assert arrays.augment and arrays.mean.shape == (3,)
    np.testing.assert_allclose(arrays.mean, want_train.reshape(-1, 3).mean(0), rtol=1e-5)


@pytest.mark.parametrize("point_at_subfolder", [False, True])
def test_cifar10_binary(tmp_path: Path, point_at_subfolder: bool) -> None:
    truth = write_cifar10_bin(tmp_path, np.random.default_rng(0))
    data_dir = tmp_path / "cifar-10-batches-bin" if point_at_subfolder else tmp_path
    arrays = get_problem("image_cifar10").load(str(data_dir), 0)
    _check(arrays, truth, "test_batch.bin", 10)
    assert len(arrays.y_train) == 5 * PER_FILE


def test_cifar10_pickle(tmp_path: Path) -> None:
    truth = write_cifar_pickle(tmp_path, np.random.default_rng(1), hundred=False)
    _check(get_problem("image_cifar10").load(str(tmp_path), 0), truth, "test_batch", 10)


def test_cifar100_binary_uses_fine_labels(tmp_path: Path) -> None:
    truth = write_cifar100_bin(tmp_path, np.random.default_rng(2))
    _check(get_problem("image_cifar100").load(str(tmp_path), 0), truth, "test.bin", 100)


def test_cifar100_pickle_uses_fine_labels(tmp_path: Path) -> None:
    truth = write_cifar_pickle(tmp_path, np.random.default_rng(3), hundred=True)
    arrays = get_problem("image_cifar100").load(str(tmp_path / "cifar-100-python"), 0)
    _check(arrays, truth, "test", 100)


def test_missing_files_name_the_expected_layout(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"cifar-10-batches-bin/\{data_batch_1.bin,"
                                                r".*test_batch.bin\} or cifar-10-batches-py/"):
        get_problem("image_cifar10").load(str(tmp_path), 0)
    with pytest.raises(FileNotFoundError, match=r"job\.data_dir is required"):
        get_problem("image_cifar100").load(None, 0)


def test_truncated_binary_file_is_reported(tmp_path: Path) -> None:
    write_cifar10_bin(tmp_path, np.random.default_rng(4))
    path = tmp_path / "cifar-10-batches-bin" / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"not a multiple of the 3073-byte record"):
        get_problem("image_cifar10").load(str(tmp_path), 0)


def test_cifar_train_pipeline_augments_and_normalises(tmp_path: Path) -> None:
    write_cifar10_bin(tmp_path, np.random.default_rng(5))
    arrays = get_problem("image_cifar10").load(str(tmp_path), 0)
    images, _ = next(iter(train_dataset(arrays, 8, seed=0)))
    assert images.shape == (8, 32, 32, 3) and images.dtype.name == "float32"
    assert abs(float(np.asarray(images).mean())) < 0.5  # centred; padding adds zeros
