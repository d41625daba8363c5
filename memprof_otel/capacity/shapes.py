"""A forward's shape features: the numbers its memory depends on (batch, sequence length, the
length of a KV cache), read from its arguments by duck typing so this module never imports torch.

The default covers what servers run: a token tensor (``input_ids``, ``inputs_embeds``, else the
first tensor argument) gives batch and sequence length; a Hugging Face ``Cache`` (anything with
``get_seq_length()``) or a legacy ``past_key_values`` tuple gives ``cache_len``, so a
``generate()`` step is modelled against batch x context. Any other model passes its own
``shape_of(args, kwargs) -> dict[str, int]``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from ..errors import MemprofError

Features = dict[str, int]
ShapeOf = Callable[[tuple[Any, ...], Mapping[str, Any]], Mapping[str, int]]

BATCH, SEQ_LEN, CACHE_LEN = "batch", "seq_len", "cache_len"
MAX_FEATURES = 6  # the fit's terms grow with pairs of features; more would need more shapes than servers see
# transformers 4.x passes past_key_values (a legacy tuple before 4.36), 5.x passes cache
_CACHE_KWARGS = ("past_key_values", "cache", "past_key_value")
_TOKEN_KWARGS = ("input_ids", "inputs_embeds", "decoder_input_ids", "x", "input")


class ShapeError(MemprofError, ValueError):
    """A shape that cannot be one: a ``shape_of`` answer (counted; the forward is not modelled), or
    what a caller asked ``fits``/``predict_peak``/``headroom`` about (raised to it, a MemprofError as
    every error of the library)."""


def _dims(t: Any) -> tuple[int, ...] | None:
    shape = getattr(t, "shape", None)
    if shape is None or not hasattr(t, "dtype"):
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # a symbolic size under tracing
        return None


def _token_tensor(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, ...] | None:
    for name in _TOKEN_KWARGS:
        v = kwargs.get(name)
        if v is not None and (d := _dims(v)) is not None:
            return d
    for v in args:
        if (d := _dims(v)) is not None:
            return d
    for v in kwargs.values():
        if (d := _dims(v)) is not None:
            return d
    return None


def _cache_len(cache: Any) -> int | None:
    """Tokens already in a KV cache: a ``Cache``'s own count, or a legacy tuple's key length."""
    get = getattr(cache, "get_seq_length", None)
    if callable(get):
        return int(get())
    if isinstance(cache, (tuple, list)) and cache:
        first = cache[0]
        if isinstance(first, (tuple, list)) and first and (d := _dims(first[0])) is not None and len(d) >= 2:
            return d[-2]  # (batch, heads, tokens, head_dim)
    return None


def default_shape_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Features:
    """Batch and sequence length of the token tensor, plus ``cache_len`` when a cache is passed.

    A 1-D input is one sequence (batch 1); a scalar or no tensor gives no features (the forward is
    not modelled). ``cache_len`` is read before the forward runs: a ``DynamicCache`` grows in place.
    """
    dims = _token_tensor(args, kwargs)
    if not dims:
        return {}
    out: Features = {BATCH: dims[0], SEQ_LEN: dims[1]} if len(dims) >= 2 else {BATCH: 1, SEQ_LEN: dims[0]}
    cache = next((kwargs[k] for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
    if cache is None:  # another name: any argument that counts its tokens like a Cache
        cache = next((v for v in kwargs.values() if callable(getattr(v, "get_seq_length", None))), None)
    if cache is not None and (n := _cache_len(cache)) is not None:
        out[CACHE_LEN] = n
    return out


def checked(features: Any) -> Features:
    """A user ``shape_of``'s answer as a shape: names to non-negative whole numbers."""
    if not isinstance(features, Mapping):
        raise ShapeError(f"shape_of must return a dict of name -> int, got {type(features).__name__}")
    if len(features) > MAX_FEATURES:
        raise ShapeError(f"shape_of returned {len(features)} features; at most {MAX_FEATURES}")
    out: Features = {}
    for k, v in features.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ShapeError(f"feature names must be identifiers, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v != int(v):
            raise ShapeError(f"feature {k!r} must be a non-negative integer, got {v!r}")
        out[k] = int(v)
    return out
