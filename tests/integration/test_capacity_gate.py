"""The capacity answers a gate relies on, on real models against an independent reference: a GPT-2
(4 layers, built from a config) called both through ``generate()`` and plainly, in either order,
learns both; a misspelt or missing feature is a ``ShapeError``; answers outside the batches seen
carry an error that covers the real peak; a float-input MLP has no sequence length to ask for.

The held-out forwards run with the handle paused, measured by the test's own ``ReferenceLedger``.
"""
from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import memprof_otel as mp

from .support.reference_ledger import reference_root_peak

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(600)

VOCAB = 4000
TOLERANCE = 0.05
PLAIN = [(b, s) for b in (1, 2, 4, 8) for s in (16, 32, 64, 128)]
GENERATE = [(1, 16), (2, 24), (4, 32), (3, 40), (8, 20)]  # (batch, prompt length)


def gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=64, n_layer=4, n_head=2,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def ids(b: int, s: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (b, s))




def _cache_kwarg(model: nn.Module) -> str:
    """transformers 5 names the cache argument ``cache``, earlier releases ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params else "cache"


def plain(model: nn.Module) -> None:
    for b, s in PLAIN:
        model(input_ids=ids(b, s))


def generate(model: nn.Module) -> None:
    for b, s in GENERATE:
        model.generate(ids(b, s), max_new_tokens=6, min_new_tokens=6, do_sample=False)


@pytest.mark.parametrize("order", ["generate first", "plain first"])
def test_plain_forwards_and_generate_calls_are_both_learnt(order: str) -> None:
    torch.manual_seed(0)
    model = gpt2()
    h = mp.instrument(model, name=f"gpt2-{order.split()[0]}", every_n_forwards=1, overhead_budget=1.0,
                      max_shapes=256)
    with torch.no_grad():
        for feed in ((generate, plain) if order == "generate first" else (plain, generate)):
            feed(model)
    h.capacity.model.states(force=True)
    doc = h.headroom()
    fit = doc["model_fit"]
    assert fit["forwards_with_other_features"] == 0 and doc["note"] is None
    assert fit["regimes"]["prefill"]["reason"] is None and fit["regimes"]["decode"]["reason"] is None
    assert fit["regimes"]["prefill"]["shapes"] == len(PLAIN) + len(GENERATE)  # generate's prompts cut logits

    h.pause()
    for b, s in [(3, 100), (6, 48)]:  # plain forwards at shapes never seen
        p = h.predict_peak(batch=b, seq_len=s)
        assert p.reason is None and not p.extrapolates, p
        measured = reference_root_peak(model, lambda: model(input_ids=ids(b, s)))
        assert abs(p.peak_increase_bytes - measured) / measured <= TOLERANCE, (b, s, p, measured)
    for b, context in [(2, 30), (5, 25)]:  # a decode step at a batch x context generate() never ran
        with torch.no_grad():
            cache = model(ids(b, context), use_cache=True).past_key_values
        p = h.predict_peak(batch=b, seq_len=1, cache_len=context)
        assert p.reason is None and p.regime == "decode", p
        measured = reference_root_peak(model, lambda: model(ids(b, 1), use_cache=True, **{_cache_kwarg(model): cache}))
        assert abs(p.peak_increase_bytes - measured) / measured <= TOLERANCE, (b, context, p, measured)

    # a gate with a typo, or without a feature it needs, fails at once whatever unknown= says
    with pytest.raises(mp.ShapeError, match="seqlen") as e:
        h.fits(batch=4, seqlen=64)
    assert e.value.features == ("seqlen",)
    with pytest.raises(mp.ShapeError, match=r"missing feature \[seq_len\]"):
        h.fits(batch=4)
    with pytest.raises(mp.ShapeError):
        h.headroom(batch=4)


def test_a_service_that_only_calls_generate_gets_a_table_of_its_prompts_on_the_shipped_defaults() -> None:
    """A GPT-2 served through ``generate()`` alone, on the shipped defaults (the new shapes attributed
    beyond the budget): its table is of the prompts it runs (the last position's logits), every row
    known, and a prompt of a size it never ran is predicted within 5 % of the reference's own
    measure of that call (the prompt generate() makes: an empty cache, ``logits_to_keep=1``)."""
    torch.manual_seed(0)
    model = gpt2()
    h = mp.instrument(model, name="gpt2-generate-only",
                      config={"capacity": {"limit_bytes": "2GiB", "seq_lens": [16, 40]}})
    with torch.no_grad():  # eight prompt sizes, six new tokens each
        for b, s in GENERATE + [(6, 12), (2, 36), (5, 28)]:
            model.generate(ids(b, s), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    h.capacity.model.states(force=True)
    doc = h.headroom()
    assert doc["table_call"]["kind"] == "generate" and doc["table_call"]["logits"] == 1
    rows = doc["max_safe_batch_rows"]
    # known to the model's reach: the batch, or past capacity.max_extrapolation (2 GiB is far more
    # than 8 x the largest batch seen needs) the largest batch within it; a plain forward's logits
    # would have put every row 16-40x outside the shapes seen before any batch was asked about
    assert [r["seq_len"] for r in rows] == [16, 40], rows
    for r in rows:
        assert (r["batch"] or r["at_least"] or 0) >= 8 and "logits" not in (r["reason"] or ""), r
    assert h.status()["attributed_forwards"] < h.status()["forwards"]  # the budget's picks and the new shapes
    h.pause()
    b, s = 3, 30  # a prompt generate() never ran
    p = h.predict_peak(batch=b, seq_len=s)
    assert p.reason is None and p.features.get("logits") == 1, p
    with torch.no_grad():
        measured = reference_root_peak(model, lambda: model(input_ids=ids(b, s), use_cache=True, logits_to_keep=1))
    assert abs(p.peak_increase_bytes - measured) / measured <= TOLERANCE, (p, measured)


def test_the_error_outside_the_batches_seen_covers_the_real_peak() -> None:
    """Fitted on batches 1-4, the predictions at 8, 16 and 32 (2x, 4x and 8x the largest seen)
    against the reference: each says how far out it is, and its upper bound holds the real peak."""
    torch.manual_seed(0)
    model = gpt2()
    h = mp.instrument(model, name="gpt2-far", every_n_forwards=1, overhead_budget=1.0)
    with torch.no_grad():
        for b in (1, 2, 3, 4):
            for s in (16, 64, 128):
                model(input_ids=ids(b, s))
    h.capacity.model.states(force=True)
    h.pause()
    seen = []
    for b in (8, 16, 32):
        p = h.predict_peak(batch=b, seq_len=64)
        measured = reference_root_peak(model, lambda: model(input_ids=ids(b, 64)))
        seen.append((b, p.extrapolation_factor, p.error_ratio, p.peak_increase_bytes / measured - 1))
        assert p.extrapolates and p.extrapolation_factor == pytest.approx(b / 4)
        assert p.upper_bytes >= measured, seen
        assert p.peak_increase_bytes * (1 - p.error_ratio) <= measured, seen  # and from below
    print("\n(batch, extrapolation factor, error carried, prediction / measured - 1):", seen)
    assert [e for _, _, e, _ in seen] == sorted(e for _, _, e, _ in seen)  # farther out, less sure


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_float_input_model_has_a_batch_and_no_length_to_ask_for() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    h = mp.instrument(model, name="mlp", every_n_forwards=1, overhead_budget=1.0)
    with torch.no_grad():
        for n in (64, 128, 256, 512, 1024):
            model(torch.randn(n, 32))
    h.capacity.model.states(force=True)
    doc = h.headroom()
    assert doc["model_fit"]["features"] == ["batch"]
    p = h.predict_peak(batch=4096)
    assert p.reason is None and p.extrapolation_factor == 4.0
    h.pause()
    measured = reference_root_peak(model, lambda: model(torch.randn(4096, 32)))
    assert p.upper_bytes >= measured and abs(p.peak_increase_bytes - measured) / measured <= TOLERANCE
    assert list(doc["max_safe_batch"]) == ["any"]
    with pytest.raises(mp.ShapeError, match=r"unknown feature \[seq_len\]: the model's features are \[batch\]"):
        h.predict_peak(batch=4, seq_len=32)
