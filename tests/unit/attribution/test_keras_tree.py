"""The Keras layer tree as dotted paths, on small stand-ins for Keras's classes (no keras needed).

The stand-ins carry what the code reads from real Keras objects: a ``Layer`` class defined in a
module under ``keras.``, a ``name``, and ``_flatten_layers(include_self=False, recursive=False)``.
``tests/integration/test_keras_torch_backend.py`` checks the same against real Keras.
"""
from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from memprof_otel.attribution import frameworks
from memprof_otel.attribution.frameworks import adapter_for
from memprof_otel.attribution.keras_tree import is_keras_layer, keras_backend_of, keras_layer_paths
from memprof_otel.attribution.selection import select_layers
from memprof_otel.errors import InstrumentationError


def _keras_class(name: str, module: str, *bases: type, **body: Any) -> type:
    return type(name, bases or (object,), {"__module__": module, "__qualname__": name, **body})


class _Base:
    """What every stand-in layer has: a name and its children, listed the way Keras does."""

    def __init__(self, name: str, children: list[Any] | None = None) -> None:
        self.name = name
        self.children = children or []
        self.flatten_calls: list[dict[str, Any]] = []

    def _flatten_layers(self, **kwargs: Any) -> list[Any]:
        self.flatten_calls.append(kwargs)
        return list(self.children)


Operation = _keras_class("Operation", "keras.src.ops.operation")
TorchLayer = _keras_class("TorchLayer", "keras.src.backend.torch.layer")
Layer = _keras_class("Layer", "keras.src.layers.layer", _Base, TorchLayer, Operation)
InputLayer = _keras_class("InputLayer", "keras.src.layers.core.input_layer", Layer)
Dense = _keras_class("Dense", "keras.src.layers.core.dense", Layer)
Model = _keras_class("Model", "keras.src.models.model", Layer)


class UserBlock(Layer):  # type: ignore[misc, valid-type]
    """A user's custom layer: defined outside keras, derived from its Layer."""


def _paths(model: Any) -> list[str]:
    return [p for p, _ in keras_layer_paths(model)]


# ---- recognising a Keras layer ------------------------------------------------------------------
def test_keras_layers_models_and_user_subclasses_are_recognised() -> None:
    assert is_keras_layer(Dense("d"))
    assert is_keras_layer(Model("m"))
    assert is_keras_layer(UserBlock("b"))


@pytest.mark.parametrize("obj", [
    object(), {}, "Layer",
    _keras_class("Layer", "mylib.layers")(),           # a class named Layer outside keras
    _keras_class("Layer", "tf_keras.src.engine")(),     # keras. is a prefix, not a substring
    _keras_class("KerasTensor", "keras.src.backend.common.keras_tensor")(),  # keras, but no layer
    Operation(),                                          # a Keras op is not a layer
])
def test_other_objects_are_not_keras_layers(obj: Any) -> None:
    assert not is_keras_layer(obj)


def test_recognising_imports_nothing() -> None:
    before = set(sys.modules)
    is_keras_layer(object())
    is_keras_layer(Dense("d"))
    keras_layer_paths(Model("m", [Dense("d")]))
    assert set(sys.modules) == before


def test_backend_is_read_from_the_backend_base_class() -> None:
    assert keras_backend_of(Dense("d")) == "torch"
    jax_layer = _keras_class("Layer", "keras.src.layers.layer",
                             _Base, _keras_class("JaxLayer", "keras.src.backend.jax.layer"))
    assert keras_backend_of(jax_layer("d")) == "jax"
    assert keras_backend_of(object()) is None
    assert keras_backend_of(_keras_class("Layer", "keras.src.layers.layer", _Base)("d")) is None


# ---- the tree -------------------------------------------------------------------------------------
def test_root_first_then_depth_first_in_keras_order_joined_with_dots() -> None:
    inner = Model("inner", [Dense("d"), Dense("act")])
    model = Model("outer", [InputLayer("input_layer"), Dense("d1"), inner, Dense("head")])
    got = keras_layer_paths(model)
    assert [p for p, _ in got] == ["", "d1", "inner", "inner.d", "inner.act", "head"]
    assert got[0][1] is model and got[2][1] is inner
    assert dict(got)["inner.d"] is inner.children[0]
    # the root's own name is not part of any path (the root is "")
    assert not any(p.startswith("outer") for p in _paths(model))


def test_every_layer_is_asked_for_its_direct_children_only() -> None:
    leaf = Dense("leaf")
    mid = UserBlock("mid", [leaf])
    model = Model("m", [mid])
    keras_layer_paths(model)
    for layer in (model, mid, leaf):
        assert layer.flatten_calls == [{"include_self": False, "recursive": False}]


def test_input_layers_are_left_out_at_every_level() -> None:
    sub = Model("sub", [InputLayer("input_layer_1"), Dense("hid")])
    model = Model("f", [InputLayer("input_layer"), Dense("d"), sub])
    assert _paths(model) == ["", "d", "sub", "sub.hid"]


def test_the_same_name_at_two_levels_gives_two_paths() -> None:
    model = Model("f", [Dense("d"), Model("submodel", [Dense("hid"), Dense("d")])])
    assert _paths(model) == ["", "d", "submodel", "submodel.hid", "submodel.d"]


def test_a_dot_in_a_keras_name_becomes_an_underscore() -> None:
    model = Model("m", [Model("enc.v2", [Dense("fc.1")])])
    assert _paths(model) == ["", "enc_v2", "enc_v2.fc_1"]


def test_siblings_of_the_same_name_are_numbered_in_definition_order() -> None:
    # a subclassed model may hold two layers of one name; "fc.1" and "fc_1" collide once dotted
    model = Model("net", [Dense("x"), Dense("x"), Dense("x"), Dense("x_1"), Dense("fc_1"), Dense("fc.1")])
    assert _paths(model) == ["", "x", "x_1", "x_2", "x_1_1", "fc_1", "fc_1_1"]


def test_an_empty_name_becomes_the_class_name() -> None:
    assert _paths(Model("m", [Dense(""), Dense("")])) == ["", "Dense", "Dense_1"]


def test_a_shared_layer_keeps_its_first_path_and_appears_once() -> None:
    shared = Dense("shared")
    model = Model("m", [Model("a", [shared]), Model("b", [shared, Dense("own")])])
    got = keras_layer_paths(model)
    assert [p for p, _ in got] == ["", "a", "a.shared", "b", "b.own"]
    assert sum(1 for _, layer in got if layer is shared) == 1


def test_a_layer_listing_its_ancestor_does_not_loop() -> None:
    model = Model("m")
    child = UserBlock("child", [model])
    model.children = [child]
    assert _paths(model) == ["", "child"]


def test_a_deep_tree_does_not_hit_the_recursion_limit() -> None:
    depth = sys.getrecursionlimit() + 100
    model = layer = Model("m")
    for i in range(depth):
        nxt = UserBlock(f"l{i}")
        layer.children = [nxt]
        layer = nxt
    paths = _paths(model)
    assert len(paths) == depth + 1 and paths[-1].count(".") == depth - 1


def test_without_the_private_walk_the_public_layers_list_is_used() -> None:
    class NoFlatten(Model):  # type: ignore[misc, valid-type]
        _flatten_layers = None

        @property
        def layers(self) -> list[Any]:
            return self.children

    model = NoFlatten("m", [Dense("a"), Dense("b")])
    assert _paths(model) == ["", "a", "b"]


# ---- the paths in the layer selection --------------------------------------------------------
def test_max_depth_counts_keras_levels_not_dots_in_names() -> None:
    model = Model("m", [Dense("fc.1"), Model("inner", [Dense("d"), Model("deeper", [Dense("x")])])])
    kept = select_layers(_paths(model), max_depth=1, include=(), exclude=(), max_layers=100)
    assert set(kept) == {"", "fc_1", "inner"}
    kept = select_layers(_paths(model), max_depth=2, include=(), exclude=("inner.deeper",), max_layers=100)
    assert set(kept) == {"", "fc_1", "inner", "inner.d"}


# ---- what instrument() says about a Keras model it cannot take --------------------------------------
def test_a_keras_model_on_another_backend_is_refused_naming_the_backend() -> None:
    openvino_model = _keras_class("Layer", "keras.src.layers.layer",
                                  _Base, _keras_class("OpenVINOLayer", "keras.src.backend.openvino.layer"))("m")
    with pytest.raises(InstrumentationError) as e:
        adapter_for(openvino_model)
    msg = str(e.value)
    assert "torch.nn.Module" in msg and "openvino backend" in msg and "KERAS_BACKEND=torch" in msg
    # what still measures it, and which backends are taken
    assert "process series" in msg and "TensorFlow or JAX backend" in msg


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_keras_model_on_tensorflow_or_jax_goes_to_that_backends_adapter(
        monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    base = {"tensorflow": "TFLayer", "jax": "JaxLayer"}[backend]
    model = _keras_class("Layer", "keras.src.layers.layer",
                         _Base, _keras_class(base, f"keras.src.backend.{backend}.layer"))("m")
    imported: list[str] = []

    def fake_import(name: str) -> Any:  # neither framework is in this environment: only the choice is checked
        imported.append(name)
        return types.SimpleNamespace(attach=f"the {backend} attach")

    monkeypatch.setattr(frameworks.importlib, "import_module", fake_import)
    assert adapter_for(model) == f"the {backend} attach"
    assert imported == [f"memprof_otel.attribution.{backend}.instrumentation"]


def test_other_objects_are_refused_naming_their_type() -> None:
    with pytest.raises(InstrumentationError) as e:
        adapter_for(object())
    assert "torch.nn.Module" in str(e.value) and "builtins.object" in str(e.value)
    assert "KERAS_BACKEND" not in str(e.value)
