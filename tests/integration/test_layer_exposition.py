"""The fast writer of the per-layer families gives byte for byte what prometheus_client writes."""
from __future__ import annotations

import torch
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from torch import nn

import memprof_otel as mp
from memprof_otel.export.layer_exposition import LAYER_FAMILIES
from memprof_otel.export.prometheus import make_registry, render_exposition
from memprof_otel.runtime import runtime
from tests.integration.support.helpers import wait_until


def _layer_lines(text: str) -> list[str]:
    """HELP/TYPE/UNIT/sample lines of the layer families, in the order written."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ")
        if line.startswith(("# HELP ", "# TYPE ", "# UNIT ")):
            name = parts[2]
        elif line.startswith("#"):
            continue
        else:
            name = parts[0].split("{")[0]
        if any(name == f or name in (f + "_count", f + "_sum") for f in LAYER_FAMILIES):
            out.append(line)
    return out


def _series(line: str) -> str:
    """A sample line without its value (comment lines whole)."""
    return line if line.startswith("#") else line.rsplit(" ", 1)[0]


class Odd(nn.Module):
    """Module names that need escaping in a label value."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module('we"ird\\name', nn.Linear(4, 4))
        self.add_module("plain", nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.children():
            x = m(x)
        return x


def test_fast_layer_block_equals_prometheus_client_in_text_and_openmetrics():
    # GIVEN two models with attributed forwards (one with names that need escaping)
    mp.start_monitoring({"sampler": {"interval": "50ms"}})
    a, b = Odd(), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    mp.instrument(a, name='odd"model', every_n_forwards=1, overhead_budget=1.0)
    mp.instrument(b, name="seq", every_n_forwards=1, overhead_budget=1.0)
    for _ in range(3):
        a(torch.randn(2, 4))
        b(torch.randn(2, 4))
    # the sampler's first ticks add their families (process, sources, leak figures): let them land and
    # hold the sampler still, so the two reads below see the same series
    sampler = runtime().sampler
    wait_until(lambda: sampler.ticks >= 3, what="three sampler ticks")
    sampler.stop()
    rt = runtime().scrape
    full, lean = make_registry(rt), make_registry(rt, layers=False)

    for accept, generate in (("", generate_latest), ("application/openmetrics-text", generate_openmetrics)):
        # WHEN the endpoint's exposition is built (lean registry + fast writer)
        body, _ = render_exposition(rt, lean, accept)
        reference = generate(full).decode()
        text = body.decode()

        # THEN the layer lines are exactly prometheus_client's, and nothing else changed
        ours, theirs = _layer_lines(text), _layer_lines(reference)
        assert len(theirs) > 20 and ours == theirs
        # the other families are read twice, moments apart: process and GC figures move between
        # the two reads, so outside the layer families the series must agree, not their values
        assert sorted(map(_series, text.splitlines())) == sorted(map(_series, reference.splitlines()))
        if accept:
            assert text.endswith("# EOF\n") and text.count("# EOF") == 1
            # OpenMetrics names each family's unit; the ratio and summary families too
            assert "# UNIT memprof_layer_peak_increase_bytes bytes" in ours
            assert "# UNIT memprof_layer_fragmentation_ratio ratio" in ours
            assert "# UNIT memprof_layer_forward_seconds seconds" in ours
        else:
            assert not any(line.startswith("# UNIT") for line in text.splitlines())
    assert any('layer="we\\"ird\\\\name"' in line for line in ours)
