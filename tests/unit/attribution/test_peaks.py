"""The window-splitting peak tracker, driven by a scripted counter (plain ints, no torch)."""
from memprof_otel.attribution.peaks import PeakTracker
from memprof_otel.sources.base import Reading


class ScriptedCounter:
    """A device counter with one peak register, like CUDA's allocator or the ledger."""

    def __init__(self) -> None:
        self.level = self.peak = self.allocs = self.frees = 0

    def alloc(self, n: int) -> None:
        self.level += n
        self.allocs += 1
        self.peak = max(self.peak, self.level)

    def free(self, n: int) -> None:
        self.level -= n
        self.frees += 1

    def reading(self) -> Reading:
        return Reading(self.level, self.level, self.peak, self.allocs, self.frees, 0.0, self.peak)

    def reset_peak(self) -> None:
        self.peak = self.level


class Driver:
    def __init__(self) -> None:
        self.c = ScriptedCounter()
        self.t = PeakTracker()
        self.calls = {}
        self.now = 0.0

    def enter(self, path: str) -> None:
        self.now += 1
        self.t.enter(path, hash(path), self.c.reading(), self.now)
        self.c.reset_peak()

    def exit(self, path: str, raised: bool = False) -> None:
        self.now += 1
        for call in self.t.exit(hash(path), self.c.reading(), self.now, raised):
            self.calls.setdefault(call.path, []).append(call)
        self.c.reset_peak()


def test_transient_counts_for_layer_and_ancestors_not_siblings():
    d = Driver()
    d.c.alloc(100)  # before the forward: the baseline
    d.enter("")
    d.enter("a")
    d.c.alloc(10)
    d.exit("a")
    d.enter("b")
    d.enter("b.x")
    d.c.alloc(1000)  # transient inside b.x
    d.c.free(1000)
    d.exit("b.x")
    d.c.alloc(5)
    d.exit("b")
    d.exit("")
    a, b, bx, root = d.calls["a"][0], d.calls["b"][0], d.calls["b.x"][0], d.calls[""][0]
    assert bx.peak_increase == 1000 and bx.retained == 0
    assert b.peak_increase == 1000 and b.retained == 5
    assert root.peak_increase == 1010 and root.retained == 15
    assert a.peak_increase == 10  # the sibling never sees b.x's transient
    assert root.peak_level == 1110 and root.entry_level == 100


def test_parent_peak_before_child_survives_child_reset():
    d = Driver()
    d.enter("")
    d.c.alloc(500)  # parent's own transient, freed before the child runs
    d.c.free(500)
    d.enter("child")
    d.c.alloc(50)
    d.exit("child")
    d.exit("")
    assert d.calls[""][0].peak_increase == 500
    assert d.calls["child"][0].peak_increase == 50


def test_parent_peak_after_child_counts():
    d = Driver()
    d.enter("")
    d.enter("child")
    d.exit("child")
    d.c.alloc(70)
    d.c.free(70)
    d.exit("")
    assert d.calls[""][0].peak_increase == 70


def test_module_called_twice_records_each_call():
    d = Driver()
    d.enter("")
    for n in (10, 30):
        d.enter("shared")
        d.c.alloc(n)
        d.c.free(n)
        d.exit("shared")
    d.exit("")
    assert [c.peak_increase for c in d.calls["shared"]] == [10, 30]


def test_exit_closes_frames_left_open_and_marks_them_raised():
    d = Driver()
    d.enter("")
    d.enter("a")
    d.enter("a.b")
    d.c.alloc(40)
    d.exit("", raised=True)  # inner exits never ran
    assert [c.path for c in sum(d.calls.values(), [])] and d.t.depth == 0
    assert d.calls["a.b"][0].raised and d.calls["a"][0].raised and d.calls[""][0].raised
    assert d.calls[""][0].peak_increase == 40


def test_exit_of_unknown_key_leaves_stack_alone():
    d = Driver()
    d.enter("")
    d.exit("never-entered")
    assert d.t.depth == 1 and d.calls == {}


def test_allocation_counts_are_per_frame():
    d = Driver()
    d.enter("")
    d.c.alloc(1)
    d.enter("a")
    d.c.alloc(1)
    d.c.alloc(1)
    d.c.free(1)
    d.exit("a")
    d.exit("")
    assert (d.calls["a"][0].allocations, d.calls["a"][0].frees) == (2, 1)
    assert (d.calls[""][0].allocations, d.calls[""][0].frees) == (3, 1)
