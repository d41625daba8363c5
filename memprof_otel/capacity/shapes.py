"""A forward's shape features: the numbers its memory depends on (batch, sequence length, the
length of a KV cache), read from its arguments by duck typing so this module never imports torch.

The default covers what servers run: a token tensor (``input_ids``, ``inputs_embeds``, else the
first tensor argument) gives batch and sequence length; a Hugging Face ``Cache`` (anything with
``get_seq_length()``) or a legacy ``past_key_values`` tuple gives ``cache_len``, so a
``generate()`` step is modelled against batch x context. A non-token input (a float ``(n, 32)``
table, an image batch) gives ``batch`` alone: its trailing dimensions are the model's own width, a
constant of the model, not something a caller must give. Any other model passes its own
``shape_of(args, kwargs) -> dict[str, int]``.

Two of the default features are *implied* when a call does not give them: ``cache_len`` is 0 (a
forward with no cache is a prompt, the same as one with an empty cache) and ``logits`` (the
positions whose logits are computed, which ``generate()`` cuts to 1 with ``logits_to_keep``) is the
sequence length. So every standard call of one model has one feature set, whichever way it is called.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from ..errors import ShapeError  # noqa: F401 - raised here; its home is memprof_otel.errors

Features = dict[str, int]
ShapeOf = Callable[[tuple[Any, ...], Mapping[str, Any]], Mapping[str, int]]

BATCH, SEQ_LEN, CACHE_LEN, LOGITS = "batch", "seq_len", "cache_len", "logits"
STANDARD = frozenset((BATCH, SEQ_LEN, CACHE_LEN, LOGITS))  # the names the default shape_of can give
MAX_FEATURES = 6  # the fit's terms grow with pairs of features; more would need more shapes than servers see
# transformers 4.x passes past_key_values (a legacy tuple before 4.36), 5.x passes cache
_CACHE_KWARGS = ("past_key_values", "cache", "past_key_value")
_TOKEN_KWARGS = ("input_ids", "inputs_embeds", "decoder_input_ids", "x", "input")
_ID_KWARGS = ("input_ids", "decoder_input_ids")  # always tokens, whatever their dtype
# transformers >= 4.50 names it logits_to_keep, 4.45-4.49 num_logits_to_keep
_LOGITS_KWARGS = ("logits_to_keep", "num_logits_to_keep")


def implied(name: str, features: Mapping[str, int]) -> int | None:
    """The value a call that does not give ``name`` has: 0 for ``cache_len`` (no cache: a prompt),
    the sequence length for ``logits`` (every position's logits); None: a feature the call must give."""
    if name == CACHE_LEN:
        return 0
    if name == LOGITS:
        return features.get(SEQ_LEN)
    return None


def canonical(features: Mapping[str, int]) -> Features:
    """The features with every implied one at its implied value left out: a prompt passed an empty
    cache and one passed none are the same shape."""
    out = dict(features)
    for name in (CACHE_LEN, LOGITS):
        if name in out and out[name] == implied(name, out):
            del out[name]
    if LOGITS in out and SEQ_LEN in out and out[LOGITS] > out[SEQ_LEN]:
        del out[LOGITS]  # asking for more positions than there are computes them all
    return out


def _dims(t: Any) -> tuple[int, ...] | None:
    shape = getattr(t, "shape", None)
    if shape is None or not hasattr(t, "dtype"):
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # a symbolic size under tracing
        return None


def _token_tensor(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[tuple[int, ...], bool] | None:
    """The dims of the input tensor and whether it holds token ids (named so, or of an integer dtype)."""
    for name in _TOKEN_KWARGS:
        v = kwargs.get(name)
        if v is not None and (d := _dims(v)) is not None:
            return d, name in _ID_KWARGS or _integer(v)
    for v in (*args, *kwargs.values()):
        if (d := _dims(v)) is not None:
            return d, _integer(v)
    return None


def _integer(t: Any) -> bool:
    """An integer dtype, by its name (torch.int64, tf int32, numpy int64, keras 'int32')."""
    name = str(getattr(t, "dtype", "")).lower()
    return "int" in name and "float" not in name  # not a quantised float ("qint8" counts as int)


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
    """Batch and sequence length of the token tensor, plus ``cache_len`` when a non-empty cache is
    passed and ``logits`` when ``logits_to_keep`` cuts the positions whose logits are computed.

    Token ids (``input_ids``, or any integer tensor) of shape ``(b, s)`` give ``batch`` b and
    ``seq_len`` s; a 1-D one is one sequence (batch 1). A float tensor of 3 dimensions is a batch of
    sequences of vectors (``inputs_embeds``, a Keras sequence model): batch and seq_len, its last
    dimension the model's width. Any other (a float ``(n, d)`` table, an image batch) gives ``batch``
    alone: the rest is the model's width, a constant of the model (a model whose per-sample size
    varies, images of several sizes, needs a ``shape_of``). A scalar or no tensor gives no features
    (the forward is not modelled). ``cache_len`` is read before the forward runs: a ``DynamicCache``
    grows in place.
    """
    found = _token_tensor(args, kwargs)
    if found is None or not found[0]:
        return {}
    dims, tokens = found
    if tokens and len(dims) <= 2 or len(dims) == 3:
        out: Features = {BATCH: dims[0], SEQ_LEN: dims[1]} if len(dims) >= 2 else {BATCH: 1, SEQ_LEN: dims[0]}
    else:
        return {BATCH: dims[0] if len(dims) >= 2 else 1}
    cache = next((kwargs[k] for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
    if cache is None:  # another name: any argument that counts its tokens like a Cache
        cache = next((v for v in kwargs.values() if callable(getattr(v, "get_seq_length", None))), None)
    if cache is not None and (n := _cache_len(cache)) is not None and n > 0:
        out[CACHE_LEN] = n
    keep = next((kwargs[k] for k in _LOGITS_KWARGS if kwargs.get(k) is not None), None)
    if isinstance(keep, int) and not isinstance(keep, bool) and 0 < keep < out[SEQ_LEN]:
        out[LOGITS] = keep  # 0 means every position in transformers
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
