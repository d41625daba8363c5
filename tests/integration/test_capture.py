"""Deep capture on real CPU models: every allocation attributed, speedscope output validated."""
from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch

import memprof_otel as mp
from tests.schemas import speedscope_validator

from .support.models import F32, Tree, WithRaiser


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    return speedscope_validator()


def _sampled(doc: dict) -> tuple[list[str], dict[tuple[str, ...], int]]:
    names = [f["name"] for f in doc["shared"]["frames"]]
    prof = doc["profiles"][0]
    return names, {tuple(names[i] for i in s): w for s, w in zip(prof["samples"], prof["weights"])}


def test_capture_attributes_every_allocation_to_module_and_op(validator, tmp_path):
    model = Tree()
    with mp.instrument(model, name="tree", overhead_budget=0.0) as h:  # no sampled attribution
        cap = h.capture(forwards=1)
        assert not cap.done
        model(torch.randn(4, 8))
        assert cap.wait(5) and cap.done
        doc = cap.speedscope()
        h.export_speedscope(tmp_path / "t.speedscope.json")
    validator.validate(doc)
    assert json.loads((tmp_path / "t.speedscope.json").read_text()) == doc
    _, stacks = _sampled(doc)
    by_leaf_module = {}
    for stack, w in stacks.items():
        by_leaf_module[stack[:-1]] = by_leaf_module.get(stack[:-1], 0) + w
    assert by_leaf_module[("tree",)] == 3000 * F32  # the root's own transient
    assert by_leaf_module[("tree", "a")] == 1000 * F32 + 4 * 8 * F32
    assert by_leaf_module[("tree", "b", "b.1")] == 20000 * F32 + 4 * 8 * F32
    assert doc["profiles"][0]["unit"] == "bytes"
    assert doc["profiles"][0]["endValue"] == sum(stacks.values()) == cap.total_bytes()
    assert all(s[-1].startswith("aten::") for s in stacks)
    ev = doc["profiles"][1]
    assert ev["type"] == "evented" and ev["unit"] == "milliseconds"
    opened = [e for e in ev["events"] if e["type"] == "O"]
    assert len(opened) == len([e for e in ev["events"] if e["type"] == "C"]) == 5  # root a b b.0 b.1
    ats = [e["at"] for e in ev["events"]]
    assert ats == sorted(ats)


def test_capture_several_forwards_then_next_forward_is_not_captured():
    model = Tree()
    with mp.instrument(model, overhead_budget=0.0) as h:
        model(torch.randn(4, 8))  # the sampling's own first pick, before the capture (budget 0: no other)
        cap = h.capture(forwards=2)
        model(torch.randn(4, 8))
        assert not cap.done
        model(torch.randn(4, 8))
        assert cap.done and cap.completed == 2
        total = cap.total_bytes()
        model(torch.randn(4, 8))
        assert cap.total_bytes() == total
        assert h.layer_stats()[""].calls == 3  # the pick and the two captured, not the one after


def test_capture_busy_and_bad_arguments():
    model = Tree()
    with mp.instrument(model) as h:
        h.capture(forwards=1)
        with pytest.raises(mp.CaptureBusy):
            h.capture(forwards=1)
        for bad in (0, -1, 1.5, "2", True):
            with pytest.raises(ValueError):
                mp.Capture("m", bad)  # type: ignore[arg-type]
    with pytest.raises(mp.InstrumentationError):
        h.capture()
    with pytest.raises(mp.MemprofError):
        mp.instrument(Tree()).export_speedscope("/tmp/never-written.json")


def test_capture_wait_times_out_without_forwards():
    with mp.instrument(Tree()) as h:
        cap = h.capture(forwards=1)
        assert cap.wait(0.05) is False and not cap.done


def test_capture_of_a_raising_forward_is_still_valid_speedscope(validator):
    model = WithRaiser()
    model.r.fail = True
    with mp.instrument(model, name="raiser") as h:
        cap = h.capture(forwards=1)
        with pytest.raises(ValueError):
            model(torch.randn(4, 8))
        assert cap.done
        doc = cap.speedscope()
    validator.validate(doc)
    _, stacks = _sampled(doc)
    assert stacks[("raiser", "r", "aten::empty.memory_format")] == 7000 * F32


def test_capture_waiter_in_another_thread():
    model = Tree()
    with mp.instrument(model) as h:
        cap = h.capture(forwards=1)
        result = []
        t = threading.Thread(target=lambda: result.append(cap.wait(10)))
        t.start()
        model(torch.randn(4, 8))
        t.join(10)
    assert result == [True]


class _Resizes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.empty(0, dtype=torch.uint8)
        t.resize_(1 << 20)  # 1 MiB allocated by growing an existing (empty) storage
        return x


class _WritesOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(0)
        torch.add(x, 1, out=out)  # out= grows the empty tensor to x's size
        return out


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_capture_counts_storage_growth_as_allocation(validator, mode: str):
    """resize_ and out= into a smaller tensor allocate by growing a storage the op was handed: a
    capture weighs the growth, as the layer figures do (reference: the sizes asked for)."""
    model = torch.nn.Sequential()
    model.add_module("r", _Resizes())
    model.add_module("o", _WritesOut())
    x = torch.zeros(1 << 16)  # 256 KiB of float32
    with mp.instrument(model, name="grow", overhead_budget=0.0) as h:
        cap = h.capture(forwards=1)
        with (torch.no_grad() if mode == "no_grad" else torch.inference_mode()):
            model(x)
        assert cap.wait(5)
        doc = cap.speedscope()
    validator.validate(doc)
    _, stacks = _sampled(doc)
    assert stacks == {("grow", "r", "aten::resize_"): 1 << 20, ("grow", "o", "aten::add.out"): x.numel() * F32}
