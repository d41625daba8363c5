"""The subclassed Keras model the Keras children build (torch, TensorFlow and JAX backends).

Takes the ``keras`` module as an argument: each child fixes its backend before importing keras, so
this module imports nothing of keras itself.
"""
from __future__ import annotations

from typing import Any


def subclassed_net(keras: Any, stem: int, block_a: int, block_b: int) -> Any:
    """A subclassed model: layers as attributes and in a list (out of torch's ``named_modules()``),
    custom layers with a sublayer (``summary()`` does not expand them, attribution does), and a
    weightless layer whose Keras name has a dot (the path says ``head_out``)."""

    class Block(keras.layers.Layer):
        def __init__(self, units: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.fc = keras.layers.Dense(units, name="fc")

        def call(self, x: Any) -> Any:
            return self.fc(x)

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__(name="net")
            self.stem = keras.layers.Dense(stem, name="stem")
            self.blocks = [Block(block_a, name="block_a"), Block(block_b, name="block_b")]
            self.head = keras.layers.ReLU(name="head.out")

        def call(self, x: Any) -> Any:
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Net()
