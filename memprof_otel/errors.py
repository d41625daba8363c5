"""Typed errors. Setup raises these; hooks, the sampler and exporters never do."""
from __future__ import annotations


def shown(v: object, limit: int = 80) -> str:
    """``repr(v)`` cut short: an error message never echoes a megabyte of someone's input."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


class MemprofError(Exception):
    """Base of every error memprof_otel raises on purpose."""


class ConfigError(MemprofError, ValueError):
    """A config key is unknown or its value is invalid. ``key`` names it (dotted)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class InstrumentationError(MemprofError, TypeError):
    """``instrument()`` was given something it cannot instrument (not a Module)."""


class AlreadyInstrumented(MemprofError, RuntimeError):
    """The module is already instrumented; call ``uninstrument()`` on the first handle."""


class SourceUnavailable(MemprofError, RuntimeError):
    """A memory source cannot run here (no CUDA, no NVML, no glibc, ...)."""


class CaptureBusy(MemprofError, RuntimeError):
    """Another deep capture is running on this model."""


class CaptureUnsupported(InstrumentationError):
    """The model's framework has no deep captures (they record each op's allocations, which only
    the PyTorch adapter sees): a Keras model on the TensorFlow backend has per-layer figures only."""


class CaptureTimeout(MemprofError, TimeoutError):
    """No forward came in time to complete a capture."""


class DumpNotFound(MemprofError, LookupError):
    """No stored dump has this id (never saved, or rotated away)."""


class InvalidDumpId(MemprofError, ValueError):
    """A dump id is malformed or would name a file outside the dump directory."""


class ShapeError(MemprofError, ValueError):
    """A shape that cannot be one. Raised to a caller of ``fits``/``predict_peak``/``headroom`` that
    named a feature the model has never seen (a typo), left out one it needs, or gave a value that
    is not a size; a ``shape_of`` answer that is not a shape is counted instead (the forward is not
    modelled). ``features`` names the offending features."""

    def __init__(self, message: str, features: tuple[str, ...] = ()) -> None:
        self.features = features
        super().__init__(message)


class UnknownModel(MemprofError, LookupError):
    """No instrumented model has this name."""


class ModelRequired(UnknownModel):
    """Several models are instrumented and the call did not say which (HTTP 400: a missing
    parameter, not an unknown name). An ``UnknownModel``, for code that catches that."""


class ServeError(MemprofError, OSError):
    """The endpoint cannot listen where asked (port taken, address not on this host)."""


class ExportError(MemprofError, OSError):
    """A file could not be written (bad path, disk full); nothing partial is left behind."""


class BlackBoxFormatError(MemprofError, ValueError):
    """A black box file that is not one: wrong magic or version, truncated, or a corrupt header."""
