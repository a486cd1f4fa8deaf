"""Model registry: Keras 3 functional models by (name, hparam_set).

Models are built by the caller inside `strategy.scope()` so that their variables land on the
parameter servers. Every model returns logits (no softmax); the loss uses from_logits=True.
Keras is imported inside the builders: listing the registry (the orchestrator validates names
in every dry run) must not pay TensorFlow's import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.registry import Registry

ModelBuilder = Callable[..., Any]  # returns a keras.Model


@dataclass(frozen=True)
class _Entry:
    builder: ModelBuilder
    hparam_sets: dict[str, dict[str, Any]]


_MODELS: Registry[_Entry] = Registry("model")


def register_model(name: str, hparam_sets: dict[str, dict[str, Any]]) -> Callable:
    """Decorator: register `builder(input_shape, num_classes, **hparams)` under `name`."""

    def wrap(builder: ModelBuilder) -> ModelBuilder:
        assert name not in _MODELS, f"model {name!r} registered twice"
        _MODELS.register(name, _Entry(builder, hparam_sets))
        return builder

    return wrap


def list_models() -> list[str]:
    return _MODELS.names()


def hparam_sets(name: str) -> list[str]:
    """Valid hparam sets of a model; ValueError lists valid model names when unknown."""
    return sorted(_get(name).hparam_sets)


def build_model(name: str, hparam_set: str, input_shape: tuple[int, ...],
                num_classes: int) -> Any:
    """Build a fresh model. Raises ValueError naming the valid choices for a typo."""
    entry = _get(name)
    if hparam_set not in entry.hparam_sets:
        raise ValueError(f"unknown hparam_set {hparam_set!r} for model {name!r} "
                         f"(valid: {', '.join(sorted(entry.hparam_sets))})")
    return entry.builder(tuple(input_shape), int(num_classes), **entry.hparam_sets[hparam_set])


def _get(name: str) -> _Entry:
    return _MODELS.get(name)  # UnknownNameError (a ValueError) listing the valid names


# --- cnn: small and fast, for 8x8 digits and throughput tests --------------------------------

@register_model("cnn", {
    "cnn_small": {"filters": (32, 64), "dense": 128},
    "cnn_tiny": {"filters": (16, 32), "dense": 64},
})
def build_cnn(input_shape: tuple[int, ...], num_classes: int, filters: tuple[int, ...],
              dense: int) -> Any:
    """Conv-conv-pool-dense. No batch norm: its moving-statistics writes would add
    parameter-server round trips to every ASP step for no accuracy gain at this size."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    x = inputs
    for f in filters:
        x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(dense, activation="relu")(x)
    outputs = layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name="cnn")


# --- resnet: CIFAR-style ResNet v1 (He et al. 2016, section 4.2) ------------------------------

@register_model("resnet", {
    "resnet_cifar_15": {"depth": 14},  # historical name (T2T); 6n+2 with n=2
    "resnet_cifar_32": {"depth": 32},
    "resnet_cifar_56": {"depth": 56},
    "resnet_cifar_20": {"depth": 20},
})
def build_resnet(input_shape: tuple[int, ...], num_classes: int, depth: int) -> Any:
    """3 stages of n basic blocks with 16/32/64 filters, n = (depth - 2) / 6.

    Stage transitions downsample with stride 2 and a 1x1 projection shortcut (option B).
    """
    import keras
    from keras import layers

    assert (depth - 2) % 6 == 0, f"resnet depth must be 6n+2 (got {depth})"
    n = (depth - 2) // 6
    inputs = keras.Input(shape=input_shape)
    x = _conv_bn(inputs, 16, 3, 1)
    x = layers.ReLU()(x)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(n):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, strides)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}")


def _conv_bn(x: Any, filters: int, kernel: int, strides: int) -> Any:
    from keras import layers

    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                      kernel_initializer="he_normal")(x)
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)


def _basic_block(x: Any, filters: int, strides: int) -> Any:
    from keras import layers

    shortcut = x
    y = layers.ReLU()(_conv_bn(x, filters, 3, strides))
    y = _conv_bn(y, filters, 3, 1)
    if strides != 1 or shortcut.shape[-1] != filters:
        shortcut = _conv_bn(shortcut, filters, 1, strides)
    return layers.ReLU()(layers.Add()([y, shortcut]))
