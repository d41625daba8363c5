"""A user's ``shape_of``: the features the memory model fits on, and one that fails never touches
the model's forward (counted, the forward unmodelled)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import memprof_otel as mp

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}


class Pixels(nn.Module):
    """An image model: its memory follows the pixel count, which the default features miss."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.conv(images).relu().mean(dim=(2, 3))


def test_a_shape_of_gives_the_features_and_the_model_learns_them():
    model = Pixels()
    h = mp.instrument(model, name="pix", shape_of=lambda args, kwargs: {
        "batch": args[0].shape[0], "pixels": args[0].shape[2] * args[0].shape[3]}, **EVERY)
    with torch.no_grad():
        for b in (1, 2, 4, 8):
            for side in (8, 16, 32):
                model(torch.randn(b, 3, side, side))
    h.capacity.model.states(force=True)
    fit = h.headroom()["model_fit"]["regimes"]["prefill"]
    assert fit["reason"] is None and fit["feature_ranges"] == {"batch": [1, 8], "pixels": [64, 1024]}
    p = h.predict_peak(batch=3, pixels=20 * 20)
    # conv output 3*8*400 floats and its relu: two such tensors at the peak, by arithmetic
    assert p.reason is None and p.peak_bytes == pytest.approx(2 * 3 * 8 * 400 * 4, rel=0.05)
    with pytest.raises(mp.ShapeError, match=r"unknown feature \[seq_len\]: the model's features are \[batch, pixels\]"):
        h.predict_peak(batch=3, seq_len=5)
    with pytest.raises(mp.ShapeError, match=r"missing feature \[pixels\]"):
        h.fits(batch=3)  # never a silent True


def test_a_shape_of_that_raises_is_counted_and_the_forward_unaffected():
    model = Pixels()
    calls = []

    def broken(args, kwargs):
        calls.append(1)
        raise RuntimeError("my shape_of has a bug")

    h = mp.instrument(model, name="pix", shape_of=broken, **EVERY)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = Pixels.forward(model, x)
        out = model(x)
    assert torch.equal(out, expected) and calls == [1]
    assert h.capacity.shape_errors == 1 and h.hook_errors == 1
    assert h.capacity.model.observed == 0
    assert h.headroom()["shape_errors"] == 1


def test_a_shape_of_that_answers_nonsense_is_counted():
    model = Pixels()
    h = mp.instrument(model, name="pix", shape_of=lambda a, k: {"batch": -1}, **EVERY)
    with torch.no_grad():
        model(torch.randn(2, 3, 8, 8))
    assert h.capacity.shape_errors == 1 and h.capacity.model.observed == 0


def test_shape_of_must_be_callable():
    with pytest.raises(mp.InstrumentationError, match="shape_of must be a callable"):
        mp.instrument(Pixels(), shape_of={"batch": 1})


def test_capacity_off_refuses_questions_with_a_typed_error():
    h = mp.instrument(Pixels(), config={"capacity": {"enabled": False}})
    assert h.capacity is None
    with pytest.raises(mp.MemprofError, match="capacity.enabled: false"):
        h.fits(batch=1)


@pytest.mark.parametrize("bad", [-1, float("nan"), "8", 2.5, True, None])
def test_a_question_about_an_impossible_shape_is_a_typed_error(bad):
    h = mp.instrument(Pixels(), name="pix-q")
    for ask in (h.fits, h.predict_peak):
        with pytest.raises(mp.MemprofError, match="batch") as raised:
            ask(batch=bad, seq_len=4)
        assert isinstance(raised.value, ValueError)  # and a ValueError, as before
