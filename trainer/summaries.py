"""TensorBoard scalars without the `tensorboard` package (tensorflow-cpu does not pull it in).

`tf.summary.scalar` lives in tensorboard; `tf.summary.write` is TF core. Tagging the tensor
with the "scalars" plugin and the scalar data class makes TensorBoard show it as usual.
"""

from __future__ import annotations

from typing import Any

_METADATA: Any = None


def write_scalar(name: str, value: float, step: int) -> None:
    """Write one scalar to the default summary writer (use inside `writer.as_default()`)."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    global _METADATA
    if _METADATA is None:
        _METADATA = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR).SerializeToString()
    tf.summary.write(name, tf.constant(float(value), tf.float32), step=step, metadata=_METADATA)
