"""The behaviour section both Keras children (TensorFlow and JAX backends) run: threads whose
forwards overlap, a forward that raises, and a layer that had an instance ``call`` of its own
before instrument(). Takes the ``keras`` module, the input and the backend's "am I eager?" as
arguments: each child fixes its backend before importing keras."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import memprof_otel as mp
from tests.integration.support.keras_child_common import ATTRIBUTE_EVERY, stats


def _meet_layer(keras: Any, eager: Callable[[], bool], parties: int, name: str) -> Any:
    """A layer that holds each eager call until ``parties`` threads are inside one (a forced
    overlap), or raises when told to: forwards that run at the same time, and one that fails."""

    class Meet(keras.layers.Layer):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.barrier = threading.Barrier(parties, timeout=30)
            self.meet = False
            self.fail = False

        def call(self, x: Any) -> Any:
            if self.fail:
                raise ValueError("told to fail")
            if self.meet and eager():
                self.barrier.wait()
            return x

    return Meet(name=name)


def behaviour(keras: Any, x: Any, eager: Callable[[], bool]) -> dict[str, Any]:
    """Run the section on ``x`` (batch x features) through a Dense(1024) and the meeting layer."""
    meet = _meet_layer(keras, eager, 2, "meet")
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(1024, name="fc"), meet], name="m")
    model(x)
    fc = model.get_layer("fc")
    own_call = fc.call  # a user's (or a quantizer's) instance ``call``: it must come back as it was
    fc.call = own_call
    h = mp.instrument(model, name="behaviour", **ATTRIBUTE_EVERY)
    out: dict[str, Any] = {}

    model(x)  # alone: attributed
    meet.meet = True

    def run() -> None:
        for _ in range(3):
            model(x)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    meet.meet = False
    out["after_threads"] = {"status": h.status(), "unattributed": dict(h.unattributed), "stats": stats(h)}

    meet.fail = True
    try:
        model(x)
        out["raised"] = False
    except ValueError:
        out["raised"] = True
    meet.fail = False
    model(x)  # works again after the failure
    out["after_failure"] = {"status": h.status(), "stats": stats(h)}
    h.uninstrument()
    out["own_call_restored"] = fc.__dict__.get("call") is own_call
    return out
