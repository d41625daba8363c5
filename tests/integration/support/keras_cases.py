"""The Keras models the TensorFlow and JAX children build, each with the Dense layers whose figures
the tests check (path written from the definition: units).

Takes the ``keras`` module as an argument: each child fixes its backend before importing keras, so
this module imports nothing of keras itself.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.integration.support.keras_subclassed import subclassed_net

# a case: (model, {path of a Dense written from the definition: its units}). In the Sequential a
# wide layer comes first: a peak left over from it must not count for the narrower layer after it
Case = tuple[Any, dict[str, int]]


def sequential_case(keras: Any, features: int) -> Case:
    """A Sequential holding a nested Sequential."""
    inner = keras.Sequential([keras.layers.Dense(1024, name="d_in"), keras.layers.ReLU(name="act")],
                             name="inner")
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(4096, name="d1"), inner],
                             name="outer")
    return model, {"d1": 4096, "inner.d_in": 1024}


def functional_case(keras: Any, features: int) -> Case:
    """A functional model calling a nested functional model; both have a layer named ``d``."""
    sub_in = keras.Input((2048,))
    submodel = keras.Model(sub_in, keras.layers.Dense(4096, name="d")(keras.layers.Dense(1024, name="hid")(sub_in)),
                           name="submodel")
    inp = keras.Input((features,))
    model = keras.Model(inp, submodel(keras.layers.Dense(2048, name="d")(inp)), name="func")
    return model, {"d": 2048, "submodel.hid": 1024, "submodel.d": 4096}


def subclassed_case(keras: Any, features: int) -> Case:
    return subclassed_net(keras, 4096, 1024, 2048), {"stem": 4096, "block_a.fc": 1024, "block_b.fc": 2048}


CASES: dict[str, Callable[[Any, int], Case]] = {"sequential": sequential_case, "functional": functional_case,
                                                "subclassed": subclassed_case}
