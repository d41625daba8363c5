"""Whether TensorFlow keeps allocator statistics on the CPU, and how to make it: no TensorFlow import.

TensorFlow reports ``get_memory_info("CPU:0")`` only when its CPU allocator is the BFC allocator.
It picks that allocator by itself only where oneDNN's optimisations are on by default (CPUs with
AVX-512 or AMX); on the many x86-64 CPUs without them (AMD EPYC before Zen 4, older Xeons, most
laptops) it uses a plain allocator that keeps no statistics, and a Keras model on TensorFlow gets
no per-layer figure. ``TF_CPU_ALLOCATOR_USE_BFC=true`` chooses BFC everywhere. TensorFlow reads the
variable when it creates its CPU device (its first op, variable or device listing), not when it is
imported: measured on tensorflow-cpu 2.21, setting it after ``import tensorflow`` and ``import keras``
but before the first op works; after the first op it has no effect for the life of the process.

So ``import memprof_otel`` sets it where it is unset (:func:`request_before_tensorflow`), which is
early enough whenever memprof_otel is imported before the model is built. A value the user set is
left alone (``TF_CPU_ALLOCATOR_USE_BFC=false`` keeps TensorFlow's own choice). The BFC allocator is
what TensorFlow already uses on AVX-512 CPUs: the figures are its chunks on both kinds of CPU (a
tensor's size up to nearly twice it, where BFC hands over a free chunk whole: the README says when).
"""
from __future__ import annotations

import os

__all__ = ["ENV", "how_requested", "request_before_tensorflow", "unavailable_hint"]

ENV = "TF_CPU_ALLOCATOR_USE_BFC"

# what request_before_tensorflow() did, for the messages and /v1/status: "set" (memprof-otel set
# the variable), "user" (it was set already), "" (not asked yet)
_requested = ""


def request_before_tensorflow(environ: dict[str, str] | None = None) -> str:
    """Set ``TF_CPU_ALLOCATOR_USE_BFC=true`` where the environment has no value for it; return
    ``"set"`` when it did, ``"user"`` when a value was there already. Imports nothing."""
    global _requested
    env = os.environ if environ is None else environ
    if ENV in env:
        _requested = "user"
    else:
        env[ENV] = "true"
        _requested = "set"
    return _requested


def how_requested() -> str:
    """How the variable came to hold its value, for ``attribution_method`` and ``/v1/status``."""
    value = os.environ.get(ENV)
    if value is None:
        return f"{ENV} unset"
    if _requested == "set" and value == "true":
        return f"{ENV}=true, set by memprof-otel at import"
    return f"{ENV}={value}, set by the environment"


def unavailable_hint() -> str:
    """What a user does when TensorFlow keeps no CPU statistics: one sentence naming the variable."""
    value = os.environ.get(ENV)
    if value is not None and value.strip().lower() not in ("1", "true"):
        return (f"{ENV}={value} keeps TensorFlow's plain CPU allocator, which keeps no statistics; "
                f"set {ENV}=true (or unset it) before TensorFlow starts")
    return (f"TensorFlow created its CPU device before {ENV}=true was set (it keeps CPU statistics "
            f"only with its BFC allocator, its default only on CPUs with AVX-512/AMX); set {ENV}=true "
            f"in the environment before the process starts, or import memprof_otel before the first "
            f"TensorFlow op")
