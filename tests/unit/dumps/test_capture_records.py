"""What a capture holds: one row per distinct stack (model, layer paths, op), summed as allocations
come, so its memory follows the stacks, not the allocations; allocations in stacks beyond its bound
are counted and named in the profile's title, never dropped silently."""
from __future__ import annotations

from memprof_otel.dumps.capture import Capture
from memprof_otel.dumps.pprof import parse_pprof


class _Op:
    """An OpOverload's naming fields (what the capture reads of the op that allocated)."""

    def __init__(self, name: str) -> None:
        self.namespace, self._opname, self._overloadname = "aten", name, "default"


def _forward(cap: Capture, layer: str, allocations: list[tuple[str, int]]) -> None:
    assert cap.claim()
    cap.forward_started(0.0)
    cap.enter(layer, None, 0.1)
    for op, n in allocations:
        cap.on_alloc(_Op(op), n)
    cap.exit(layer, None, 0.2)
    cap.forward_finished(0.3)


def test_many_allocations_in_one_stack_are_one_row_with_their_sum_and_count() -> None:
    cap = Capture("m", forwards=2)
    _forward(cap, "a", [("empty", 4)] * 100_000 + [("zeros", 0)])  # a 0-byte storage is no allocation
    _forward(cap, "a", [("empty", 4)] * 100_000 + [("add", 8)])
    assert cap.allocations == [(("m", "a", "aten::empty"), 800_000), (("m", "a", "aten::add"), 8)]
    flame = cap.flame()
    assert flame.values == ((800_000, 200_000), (8, 1))  # bytes and allocations per stack
    assert cap.total_bytes() == 800_008 and cap.dropped == 0
    assert cap.speedscope()["profiles"][0]["name"] == "m (2 forwards): bytes allocated"


def test_allocations_beyond_the_stack_bound_are_counted_and_named_in_both_files() -> None:
    cap = Capture("m", forwards=1, max_stacks=3)
    _forward(cap, "a", [(f"op{i}", 10) for i in range(5)] + [("op0", 10)] * 2)
    assert [s[-1] for s, _ in cap.allocations] == ["aten::op0", "aten::op1", "aten::op2"]
    assert cap.allocations[0][1] == 30  # a stack kept goes on summing
    assert cap.dropped == 2
    title = cap.speedscope()["profiles"][0]["name"]
    assert "2 allocations in stacks beyond the first 3 left out" in title
    profile = parse_pprof(cap.pprof())
    comments = [profile.string_table[i] for i in profile.comment]
    assert any("2 allocations in stacks beyond the first 3 left out" in c for c in comments), comments
