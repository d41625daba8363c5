"""Shape features from a forward's arguments: token tensors, KV caches, a user's shape_of."""
from __future__ import annotations

import math

import pytest
import torch

from memprof_otel.capacity.shapes import ShapeError, canonical, checked, default_shape_of


def test_token_tensor_positional_or_keyword():
    ids = torch.zeros(4, 37, dtype=torch.long)
    assert default_shape_of((ids,), {}) == {"batch": 4, "seq_len": 37}
    assert default_shape_of((), {"input_ids": ids, "attention_mask": torch.ones(9, 9)}) == {"batch": 4, "seq_len": 37}
    assert default_shape_of((), {"inputs_embeds": torch.zeros(2, 5, 8)}) == {"batch": 2, "seq_len": 5}
    assert default_shape_of((torch.zeros(11, dtype=torch.long),), {}) == {"batch": 1, "seq_len": 11}
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
    # the same shape as a prompt passed no cache (cache_len is implied 0): one kind of call
    assert default_shape_of((), {"input_ids": ids, "past_key_values": empty}) == default_shape_of((ids,), {})


def test_non_token_inputs_give_the_batch_alone():
    """A float table's or an image batch's trailing dimensions are the model's width, not a length."""
    assert default_shape_of((torch.zeros(4096, 32),), {}) == {"batch": 4096}
    assert default_shape_of((torch.zeros(8, 3, 32, 32),), {}) == {"batch": 8}
    assert default_shape_of((torch.zeros(32),), {}) == {"batch": 1}
    # a sequence of vectors (inputs_embeds, a recurrent model's input) has a length
    assert default_shape_of((torch.zeros(8, 20, 32),), {}) == {"batch": 8, "seq_len": 20}
    # token ids are integers, whatever they are called
    assert default_shape_of((torch.zeros(4, 9, dtype=torch.int32),), {}) == {"batch": 4, "seq_len": 9}


def test_logits_to_keep_is_a_feature_only_where_it_cuts_positions():
    ids = torch.zeros(2, 30, dtype=torch.long)
    assert default_shape_of((ids,), {"logits_to_keep": 1}) == {"batch": 2, "seq_len": 30, "logits": 1}
    assert default_shape_of((ids,), {"logits_to_keep": 0}) == {"batch": 2, "seq_len": 30}  # 0: every position
    one = torch.zeros(2, 1, dtype=torch.long)
    assert default_shape_of((one,), {"logits_to_keep": 1}) == {"batch": 2, "seq_len": 1}


def test_implied_features_at_their_implied_value_are_the_same_shape():
    assert canonical({"batch": 2, "seq_len": 8, "cache_len": 0}) == {"batch": 2, "seq_len": 8}
    assert canonical({"batch": 2, "seq_len": 8, "logits": 8}) == {"batch": 2, "seq_len": 8}
    assert canonical({"batch": 2, "seq_len": 8, "logits": 1}) == {"batch": 2, "seq_len": 8, "logits": 1}
    assert canonical({"rows": 3}) == {"rows": 3}


@pytest.mark.parametrize("bad, why", [
    ([1, 2], "dict"), ({"batch": -1}, "non-negative"), ({"batch": 1.5}, "non-negative integer"),
    ({"batch": math.nan}, "non-negative"), ({"batch": True}, "non-negative"), ({"not a name": 1}, "identifiers"),
    ({f"f{i}": 1 for i in range(7)}, "at most 6"),
])
def test_a_user_shape_of_answer_is_checked(bad, why):
    with pytest.raises(ShapeError, match=why):
        checked(bad)
    assert checked({"tokens": 5.0, "images": 2}) == {"tokens": 5, "images": 2}
