"""The shared Keras adapter's forwards and captures, on stand-ins for Keras's classes and a scripted backend
(a ``KerasBackend`` double whose counter the layers move by known amounts; no keras, no framework).

The real backends are checked the same way in ``tests/integration/test_keras_*_backend.py``; here
the weights are known to the byte: each innermost layer call's peak increase, written from what
the stand-in layers allocate.
"""
from __future__ import annotations

from typing import Any

import httpx
import pytest

import memprof_otel as mp
from memprof_otel.attribution.keras.instrumentation import attach_for
from memprof_otel.errors import CaptureUnsupported
from memprof_otel.runtime import runtime
from memprof_otel.sources.base import Reading

MiB = 1 << 20


class ScriptedCounter:
    """A device counter with one peak register, moved by the stand-in layers."""

    def __init__(self) -> None:
        self.level = self.peak = 0

    def alloc(self, n: int) -> None:
        self.level += n
        self.peak = max(self.peak, self.level)

    def free(self, n: int) -> None:
        self.level -= n

    def read_and_reset(self) -> Reading:
        r = Reading(self.level, self.level, self.peak, 0, 0, None, self.peak)
        self.peak = self.level
        return r

    def reset_peak(self) -> None:
        self.peak = self.level


class ScriptedBackend:
    """A ``KerasBackend`` double named "scripted"; ``counter`` raises when ``figures`` is False."""
    name = "scripted"
    title = "Scripted"

    def __init__(self, counter: ScriptedCounter, figures: bool = True) -> None:
        self._counter, self._figures = counter, figures

    def eager(self) -> bool:
        return True

    def device(self) -> Any:
        return "CPU:0"

    def device_label(self, device: Any) -> str:
        return "cpu"

    def counter(self, device: Any) -> ScriptedCounter:
        if not self._figures:
            raise RuntimeError("no statistics on this device")
        return self._counter

    def method(self, device: Any) -> str:
        return "scripted counter"

    def how(self, device: Any) -> str:
        return "scripted environment"


def _keras_class(name: str, module: str, *bases: type, **body: Any) -> type:
    return type(name, bases or (object,), {"__module__": module, "__qualname__": name, **body})


class _Base:
    """A stand-in layer: a name, its children as Keras lists them, and Keras's ``__call__``, which
    looks ``call`` up on the instance (where the adapter's wrapper sits)."""

    def __init__(self, name: str, children: list[Any] | None = None) -> None:
        self.name = name
        self.children = children or []

    def _flatten_layers(self, **kwargs: Any) -> list[Any]:
        return list(self.children)

    def __call__(self, x: Any) -> Any:
        return self.call(x)


Operation = _keras_class("Operation", "keras.src.ops.operation")
ScriptedLayer = _keras_class("ScriptedLayer", "keras.src.backend.scripted.layer")
Layer = _keras_class("Layer", "keras.src.layers.layer", _Base, ScriptedLayer, Operation)


class Allocating(Layer):  # type: ignore[misc, valid-type]
    """Makes a ``temp`` it frees and an ``out`` it keeps (its peak increase: temp + out)."""

    def __init__(self, name: str, counter: ScriptedCounter, temp: int, out: int) -> None:
        super().__init__(name)
        self.counter, self.temp, self.out = counter, temp, out

    def call(self, x: Any) -> Any:
        self.counter.alloc(self.temp)
        self.counter.alloc(self.out)
        self.counter.free(self.temp)
        return x


class Seq(Layer):  # type: ignore[misc, valid-type]
    def call(self, x: Any) -> Any:
        for child in self.children:
            x = child(x)
        return x


def _model(counter: ScriptedCounter) -> Any:
    inner = Seq("inner", [Allocating("a", counter, 2 * MiB, 1 * MiB), Allocating("b", counter, 0, 3 * MiB)])
    return Seq("outer", [Allocating("first", counter, 4 * MiB, 4 * MiB), inner])


def test_a_capture_weighs_each_innermost_call_by_its_peak_increase() -> None:
    counter = ScriptedCounter()
    model = _model(counter)
    h = attach_for(ScriptedBackend(counter))(model, name="scripted-seq", every_n_forwards=1, overhead_budget=1.0)
    try:
        model(0)  # before the capture: not in it
        cap = h.capture(forwards=2)
        model(0)
        model(0)
        assert cap.wait(5) and cap.completed == 2
        model(0)  # after it: not in it either
        weights: dict[tuple[str, ...], int] = {}
        for stack, n in cap.allocations:
            weights[stack] = weights.get(stack, 0) + n
        # innermost calls only (not "inner", not the root), twice each: temp + out
        assert weights == {("scripted-seq", "first"): 2 * 8 * MiB,
                           ("scripted-seq", "inner", "inner.a"): 2 * 3 * MiB,
                           ("scripted-seq", "inner", "inner.b"): 2 * 3 * MiB}
        doc = cap.speedscope()
        assert doc["profiles"][0]["name"] == "scripted-seq (2 forwards): peak increase of innermost layer calls"
        assert doc["profiles"][0]["endValue"] == 2 * 14 * MiB
        # the calls in time order, as on torch: each forward opens the root, then its layers
        opened = [doc["shared"]["frames"][e["frame"]]["name"] for e in doc["profiles"][1]["events"] if e["type"] == "O"]
        assert opened == 2 * ["scripted-seq", "first", "inner", "inner.a", "inner.b"]
        # the handle's own figures are untouched by the capture: four forwards attributed
        assert h.layer_stats()["inner.a"].calls == 4
    finally:
        h.uninstrument()


def test_a_model_without_sublayers_is_weighed_at_its_root() -> None:
    counter = ScriptedCounter()
    model = Allocating("solo", counter, 1 * MiB, 2 * MiB)
    h = attach_for(ScriptedBackend(counter))(model, name="solo", every_n_forwards=1, overhead_budget=1.0)
    try:
        cap = h.capture(forwards=1)
        model(0)
        assert cap.wait(5)
        assert cap.allocations == [(("solo",), 3 * MiB)]
    finally:
        h.uninstrument()


def test_a_capture_of_a_model_whose_backend_gives_no_figures_is_refused_saying_why() -> None:
    counter = ScriptedCounter()
    model = _model(counter)
    h = attach_for(ScriptedBackend(counter, figures=False))(model, name="no-figures")
    try:
        with pytest.raises(CaptureUnsupported, match="gives no memory figures on cpu"):
            h.capture()
        model(0)  # the model runs on, counted
        assert h.status()["forwards"] == 1
        # /v1/status says there are no figures, and the backend's reason
        assert h.status()["figures"] == "none: Scripted gives no memory figures for CPU:0 (no statistics on this device)"
    finally:
        h.uninstrument()


def test_status_names_what_the_figures_are_read_from_and_how() -> None:
    counter = ScriptedCounter()
    h = attach_for(ScriptedBackend(counter))(_model(counter), name="figures-how")
    try:
        assert h.status()["figures"] == "scripted counter (scripted environment)"
    finally:
        h.uninstrument()


def test_over_http_the_refusal_is_a_409_with_its_reason() -> None:
    counter = ScriptedCounter()
    model = _model(counter)
    h = attach_for(ScriptedBackend(counter, figures=False))(model, name="no-figures-http")
    runtime().connect(h)
    srv = mp.serve(port=0)
    try:
        r = httpx.post(srv.url + "/v1/dumps", params={"model": "no-figures-http", "wait": 5},
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "capture_unsupported" and "no memory figures" in r.json()["detail"]
    finally:
        srv.close()
        h.uninstrument()
        mp.shutdown(2)


def test_a_nested_model_called_on_its_own_is_a_forward_rooted_at_its_path() -> None:
    counter = ScriptedCounter()
    model = _model(counter)
    h = attach_for(ScriptedBackend(counter))(model, name="direct", every_n_forwards=1, overhead_budget=1.0)
    try:
        inner = model.children[1]
        inner(0)  # a: +2 +1 -2 (level 1, peak 3), then b: +3 (level 4): inner's peak 4 MiB, kept 4 MiB
        st = h.layer_stats()
        assert set(st) == {"inner", "inner.a", "inner.b"}  # the model's root and "first" never ran
        assert (st["inner"].peak_increase, st["inner"].retained, st["inner"].calls) == (4 * MiB, 4 * MiB, 1)
        assert (st["inner.a"].peak_increase, st["inner.a"].retained) == (3 * MiB, 1 * MiB)
        assert h.status()["forwards"] == 1
        model(0)  # inside the model's forward the same layer is no forward of its own
        assert h.status()["forwards"] == 2 and h.layer_stats()["inner"].calls == 2
    finally:
        h.uninstrument()


def test_a_capture_is_labelled_with_the_operation_its_forwards_ran_in() -> None:
    counter = ScriptedCounter()
    model = _model(counter)
    h = attach_for(ScriptedBackend(counter))(model, name="op-label", every_n_forwards=1, overhead_budget=1.0)
    current = {"op": "embed"}
    h.current_operation = lambda: current["op"]  # what the composition root hands every handle
    try:
        cap = h.capture(forwards=2)
        model(0)
        model(0)
        assert cap.wait(5)
        assert ("operation", "embed") in cap.flame().labels  # both forwards ran in "embed"
        cap2 = h.capture(forwards=2)
        model(0)
        current["op"] = None
        model(0)  # one forward outside any operation: no single operation to name
        assert cap2.wait(5)
        assert [k for k, _ in cap2.flame().labels] == ["model", "device"]
    finally:
        h.uninstrument()


class _Flights:
    """A flight listener (the black box's interface) that records what it hears."""

    def __init__(self) -> None:
        self.open: dict[int, tuple[str, str, Any, bool]] = {}
        self.log: list[tuple[str, Any]] = []
        self._next = 0

    def opened(self, model: str, root: str, features: Any, state: Any) -> int:
        self._next += 1
        self.open[self._next] = (model, root, features, state is not None)
        self.log.append(("opened", (model, root, state is not None)))
        return self._next

    def closed(self, token: int) -> None:
        self.log.append(("closed", self.open.pop(token)[:2]))


@pytest.mark.parametrize("figures", [True, False])
def test_the_black_box_hears_every_forward_in_flight_measured_or_not(figures: bool) -> None:
    """Each forward opens and closes once for the flight listeners, attributed or not, and also where
    the backend gives no figures (what a post-mortem names is the forward, not its figures); one
    that raises closes too."""
    counter = ScriptedCounter()
    model = _model(counter)
    h = attach_for(ScriptedBackend(counter, figures=figures))(model, name="flights", every_n_forwards=2,
                                                              overhead_budget=1.0)
    flights = _Flights()
    h.add_flight_listener(flights)
    try:
        seen_inside: list[int] = []
        first = model.children[0]
        plain_call = first.call

        def spy(x: Any) -> Any:
            seen_inside.append(len(flights.open))
            return plain_call(x)
        first.call = spy
        model(0)
        model(0)
        assert seen_inside == [1, 1]  # in flight while its layers run
        assert flights.open == {}     # and closed after
        opened = [x for kind, x in flights.log if kind == "opened"]
        assert [o[:2] for o in opened] == [("flights", "")] * 2
        # the attributed forward hands its state over (deepest layer entered), where figures exist
        assert sorted(o[2] for o in opened) == ([False, True] if figures else [False, False])

        def boom(x: Any) -> Any:
            raise ValueError("model error")
        first.call = boom
        with pytest.raises(ValueError):
            model(0)
        assert flights.open == {} and flights.log[-1] == ("closed", ("flights", ""))
    finally:
        h.uninstrument()
