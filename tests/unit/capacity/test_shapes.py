"""Shape features from a forward's arguments: token tensors, KV caches, a user's shape_of."""
from __future__ import annotations

import math

import pytest
import torch

from memprof_otel.capacity.shapes import ShapeError, checked, default_shape_of


def test_token_tensor_positional_or_keyword():
    ids = torch.zeros(4, 37, dtype=torch.long)
    assert default_shape_of((ids,), {}) == {"batch": 4, "seq_len": 37}
    assert default_shape_of((), {"input_ids": ids, "attention_mask": torch.ones(9, 9)}) == {"batch": 4, "seq_len": 37}
    assert default_shape_of((), {"inputs_embeds": torch.zeros(2, 5, 8)}) == {"batch": 2, "seq_len": 5}
    assert default_shape_of((torch.zeros(11),), {}) == {"batch": 1, "seq_len": 11}
    assert default_shape_of(("text", 3), {}) == {}
    assert default_shape_of((torch.tensor(1.0),), {}) == {}


def test_legacy_kv_tuple_gives_the_cache_length():
    past = tuple((torch.zeros(2, 4, 30, 8), torch.zeros(2, 4, 30, 8)) for _ in range(3))
    ids = torch.zeros(2, 1, dtype=torch.long)
    assert default_shape_of((ids,), {"past_key_values": past}) == {"batch": 2, "seq_len": 1, "cache_len": 30}


def test_hugging_face_cache_under_either_keyword():
    transformers = pytest.importorskip("transformers")
    cache = transformers.DynamicCache()
    k = torch.zeros(3, 2, 12, 4)
    cache.update(k, k.clone(), 0)
    ids = torch.zeros(3, 1, dtype=torch.long)
    for kw in ("past_key_values", "cache"):
        assert default_shape_of((), {"input_ids": ids, kw: cache}) == {"batch": 3, "seq_len": 1, "cache_len": 12}
    empty = transformers.DynamicCache()  # a prompt: the cache is passed, still empty
    assert default_shape_of((), {"input_ids": ids, "past_key_values": empty})["cache_len"] == 0


@pytest.mark.parametrize("bad, why", [
    ([1, 2], "dict"), ({"batch": -1}, "non-negative"), ({"batch": 1.5}, "non-negative integer"),
    ({"batch": math.nan}, "non-negative"), ({"batch": True}, "non-negative"), ({"not a name": 1}, "identifiers"),
    ({f"f{i}": 1 for i in range(7)}, "at most 6"),
])
def test_a_user_shape_of_answer_is_checked(bad, why):
    with pytest.raises(ShapeError, match=why):
        checked(bad)
    assert checked({"tokens": 5.0, "images": 2}) == {"tokens": 5, "images": 2}
