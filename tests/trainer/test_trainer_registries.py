"""Model and problem registries: names, shapes and the error messages for typos."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.models import build_model, hparam_sets, list_models
from trainer.problems import eval_dataset, get_problem, list_problems, train_dataset


def test_model_names() -> None:
    assert {"cnn", "resnet"} <= set(list_models())
    assert {"resnet_cifar_15", "resnet_cifar_32", "resnet_cifar_56"} <= set(hparam_sets("resnet"))
    assert "cnn_small" in hparam_sets("cnn")


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'resnt' \(cnn, resnet\)"):
        build_model("resnt", "resnet_cifar_32", (32, 32, 3), 10)
    with pytest.raises(ValueError, match=r"unknown hparam_set 'cnn_big' for model 'cnn' "
                                         r"\(valid: cnn_small, cnn_tiny\)"):
        build_model("cnn", "cnn_big", (8, 8, 1), 10)


@pytest.mark.parametrize(("hparam_set", "conv_layers"), [
    ("resnet_cifar_15", 1 + 2 * 2 * 3 + 2), ("resnet_cifar_32", 1 + 2 * 5 * 3 + 2),
    ("resnet_cifar_56", 1 + 2 * 9 * 3 + 2)])
def test_resnet_depth(hparam_set: str, conv_layers: int) -> None:
    """3 stages x n blocks x 2 convs + stem + 2 projection shortcuts."""
    model = build_model("resnet", hparam_set, (32, 32, 3), 100)
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert len(convs) == conv_layers
    assert [c.filters for c in convs][-3:] == [64, 64, 64]
    assert model.output_shape == (None, 100)


def test_cnn_small_shape() -> None:
    model = build_model("cnn", "cnn_small", (8, 8, 1), 10)
    assert model.output_shape == (None, 10)
    assert model(np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 10)


def test_problem_names_and_errors() -> None:
    assert {"digits", "image_cifar10", "image_cifar100", "synthetic"} <= set(list_problems())
    assert get_problem("image_cifar10").requires_data_dir
    assert not get_problem("digits").requires_data_dir
    with pytest.raises(ValueError, match=r"unknown problem 'mnist' \(digits, "):
        get_problem("mnist")


def test_digits_split_is_deterministic() -> None:
    a = get_problem("digits").load(None, 0)
    b = get_problem("digits").load(None, 0)
    c = get_problem("digits").load(None, 1)
    assert a.input_shape == (8, 8, 1) and a.num_classes == 10
    assert len(a.y_test) == 360 and len(a.y_train) == 1437  # 20 % held out
    assert a.x_train.min() >= 0.0 and a.x_train.max() <= 1.0
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_test, c.y_test)


def test_pipelines_batch_and_repeat() -> None:
    arrays = get_problem("synthetic").load(None, 0)
    images, labels = next(iter(train_dataset(arrays, 16, seed=0)))
    assert images.shape == (16, 32, 32, 3) and labels.shape == (16,)
    assert sum(int(y.shape[0]) for _, y in eval_dataset(arrays)) == len(arrays.y_test)
