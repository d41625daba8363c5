"""What TensorFlow's BFC allocator holds for tensors: the rule the Keras-on-TensorFlow figures are
checked by, written from the allocator's own contract (tensorflow/core/common_runtime/bfc_allocator.cc).

A Keras layer's figure on TensorFlow is what TF's allocator holds for it: its chunks, not the
tensors' sizes. BFC rounds a request up to 256 bytes and serves it from the smallest free chunk
that fits; it splits that chunk only when the chunk is at least twice the rounded request (or
128 MiB over it). So a tensor of ``t`` bytes is held as a chunk of at least ``round256(t)`` and at
most ``2 * round256(t) - 256`` bytes: exactly its size when no free chunk of under twice that size
is about, up to nearly twice when one is. Which of the two happens depends on what the allocator
freed before (another layer's tensors, oneDNN's kernels, the process's history), so it is not the
same on every CPU: these bounds are.

The bounds still fail on a wrong figure: a missing tensor is under the least, one counted twice or
another layer's tensors of the same size are over the most.
"""
from __future__ import annotations

ROUNDING = 256  # BFC's smallest chunk and its rounding of every request


def held_bounds(*tensor_bytes: int) -> tuple[int, int]:
    """(least, most) bytes BFC holds for tensors of these sizes alive at one time."""
    rounded = [-(-t // ROUNDING) * ROUNDING for t in tensor_bytes]
    return sum(rounded), sum(2 * r - ROUNDING for r in rounded)


def assert_held(figure: int, *tensor_bytes: int, what: object = "") -> None:
    """``figure`` is what BFC can hold for these tensors, alive at one time."""
    least, most = held_bounds(*tensor_bytes)
    assert least <= figure <= most, (what, figure, (least, most))
