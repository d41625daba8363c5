"""The budget an answer counts against is the process as it is after the last forward, not a
reading cached from before it: the reader's brief cache (a gate asks before every request) holds
only while no forward begins or ends. The reference is the process's own resident size, read with
``/proc/self/statm`` in the test."""
from __future__ import annotations

import os

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.sources import in_flight_levels

MIB = 1 << 20
KEEP = 96 * MIB


class Keeper(nn.Module):
    """A model whose forward keeps a tensor it made (a cache filling up, what a heap does not give
    back): the process holds ``KEEP`` more bytes after each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept.append(torch.ones(KEEP // 4))  # float32, every page touched
        return self.lin(x)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_every_forward_plain_ones_included_moves_the_forward_count() -> None:
    model = Keeper().eval()
    mp.instrument(model, name="counted")  # the shipped defaults: most forwards plain
    with torch.no_grad():
        for _ in range(6):
            before = in_flight_levels.epoch()
            model(torch.randn(2, 16))
            # its start and its end, each a new value (a count, never one seen before)
            assert in_flight_levels.epoch() != before
            model.kept.clear()


def test_the_answer_right_after_a_forward_counts_what_it_kept() -> None:
    model = Keeper().eval()
    with torch.no_grad():
        model(torch.randn(2, 16))  # the first forward's one-off costs, before any reading
    model.kept.clear()
    h = mp.instrument(model, name="kept", limit_bytes=_rss() + (4 << 30))
    with torch.no_grad():
        model(torch.randn(2, 16))
        for _ in range(3):
            # GIVEN a reading of the budget (as a gate's ask before a request makes one)
            before = h.headroom()["budget"]["in_use_bytes"]
            rss_before = _rss()
            # WHEN a forward keeps KEEP bytes, and the gate asks again at once (well within the
            # reader's cache of a quarter second)
            model(torch.randn(2, 16))
            after = h.headroom()["budget"]["in_use_bytes"]
            grew = _rss() - rss_before
            # THEN the answer's in-use figure moved as the process did
            assert grew >= KEEP * 0.9, grew  # the reference: the process really holds it
            assert after - before >= grew - 8 * MIB, (before, after, grew)
    model.kept.clear()
