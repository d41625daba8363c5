import pytest
from memprof_otel.attribution.scheduler import AttributionScheduler
from memprof_otel.attribution.selection import OTHER, path_depth, select_layers

PATHS = ["", "enc", "enc.layer.0", "enc.layer.0.attn", "enc.layer.1", "enc.layer.1.attn", "head"]


def test_depth():
    assert [path_depth(p) for p in ("", "a", "a.b.c")] == [0, 1, 3]


def test_max_depth_and_globs():
    sel = select_layers(PATHS, max_depth=3, include=(), exclude=("*.attn",), max_layers=100)
    assert set(sel) == {"", "enc", "enc.layer.0", "enc.layer.1", "head"}
    sel = select_layers(PATHS, max_depth=None, include=("enc.layer.*",), exclude=(), max_layers=100)
    assert set(sel) == {"", "enc.layer.0", "enc.layer.0.attn", "enc.layer.1", "enc.layer.1.attn"}


def test_max_layers_folds_rest_into_other_and_keeps_root():
    sel = select_layers(PATHS, max_depth=None, include=(), exclude=(), max_layers=3)
    assert [sel[p] for p in PATHS] == ["", "enc", "enc.layer.0", OTHER, OTHER, OTHER, OTHER]


def test_scheduler_every_forward_when_unbounded():
    s = AttributionScheduler(every_n=1, budget=1.0)
    picks = []
    for _ in range(5):
        a = s.should_attribute()
        picks.append(a)
        s.record(0.01, a, 0.0)
    assert picks == [True] * 5


def test_scheduler_every_n():
    s = AttributionScheduler(every_n=3, budget=1.0)
    picks = []
    for _ in range(7):
        a = s.should_attribute()
        picks.append(a)
        s.record(0.01, a, 0.0)
    assert picks == [True, False, False, True, False, False, True]


def test_scheduler_respects_budget():
    # plain forwards take 10 ms; an attributed one takes 20 ms (10 ms of overhead)
    s = AttributionScheduler(every_n=1, budget=0.01)
    attributed = 0
    for _ in range(5000):
        a = s.should_attribute()
        s.record(0.020 if a else 0.010, a, 0.0)
        attributed += a
    st = s.state()
    assert st.attribution_seconds <= 0.01 * st.forward_seconds + 0.020
    # with 1 % of 50 s to spend and 10 ms per attributed forward: about 50 of them
    assert 30 <= attributed <= 60


def test_scheduler_disabled():
    s = AttributionScheduler(every_n=1, budget=1.0, enabled=False)
    assert not s.should_attribute()


def test_scheduler_counts_root_hook_time_but_budgets_only_attribution():
    """The root hooks' self-timed cost is overhead (exported) but not the budget's: not attributing
    would not save it, and on millisecond forwards it alone exceeded a 0.2 % budget."""
    s = AttributionScheduler(every_n=1, budget=0.0)
    for _ in range(100):
        s.record(0.01, False, 0.001)
    assert abs(s.state().attribution_seconds - 0.1) < 1e-9
    assert s.should_attribute()
    s.record(0.02, True, 0.001)  # attributed: 10 ms over the plain EMA, the budget's
    assert not s.should_attribute()


def test_a_cold_first_forward_does_not_keep_attribution_off_for_minutes():
    """The first forward is attributed and charged whole (no plain forward to compare against);
    once plain ones are seen it is recharged at most 3 plain forwards, so a 0.2 % budget lets the
    next attribution through after ~1,500 forwards, not after the cold one's 2 s are repaid."""
    s = AttributionScheduler(every_n=1, budget=0.002)
    assert s.should_attribute()
    s.record(2.0, attributed=True, self_timed_s=0.001)  # a cold first forward: 2 s
    n = 0
    while not s.should_attribute():
        s.record(0.004, attributed=False, self_timed_s=0.000004)
        n += 1
        assert n < 10_000, "still repaying the first forward"
    assert 1000 < n < 2500
    st = s.state()
    assert st.first_attributed_s == pytest.approx(0.012, rel=0.05)
    assert st.attribution_seconds == pytest.approx(0.012 + n * 0.000004, rel=0.05)


def _drive(s: AttributionScheduler, forwards: int, novel: "callable") -> tuple[int, int]:
    """Plain forwards take 10 ms, attributed ones 13 ms; ``novel(i)``: forward i's shape is new.
    Returns (attributed, attributed through may_learn)."""
    attributed = learned = 0
    for i in range(forwards):
        a = s.should_attribute()
        if not a and s.may_learn():
            if novel(i):
                a = s.claim("prefill")
                learned += a
            else:
                s.known()
        s.record(0.013 if a else 0.010, a, 0.0)
        attributed += a
    return attributed, learned


def test_new_shapes_are_attributed_beyond_the_budget_at_first():
    """16 cycling shapes, each new on its first pass: at 0.2 % the budget's own picks would find a
    few; the first 16 new shapes are attributed whatever the budget says."""
    s = AttributionScheduler(every_n=1, budget=0.002, learning_budget=0.01)
    seen: set[int] = {0}  # the first forward is the budget's own pick

    def novel(i: int) -> bool:
        new = i % 16 not in seen
        seen.add(i % 16)
        return new

    attributed, learned = _drive(s, 16, novel)
    assert learned == 15 and attributed == 16  # the first forward is the budget's own pick
    assert s.state().learned == 15


def test_learning_is_charged_to_the_budget_so_repeats_cost_the_budget_alone():
    """After the first shapes, traffic that repeats them: the learning's cost is paid back before the
    budget picks again, so over the run attribution costs the budget's share, not more."""
    s = AttributionScheduler(every_n=1, budget=0.002, learning_budget=0.01)
    attributed, learned = _drive(s, 20_000, lambda i: 0 < i < 16)
    st = s.state()
    assert learned == 15
    assert st.attribution_seconds <= 0.002 * st.forward_seconds + 0.003


def test_endless_new_shapes_cost_at_most_the_learning_budget():
    s = AttributionScheduler(every_n=1, budget=0.002, learning_budget=0.01)
    attributed, learned = _drive(s, 20_000, lambda i: True)
    st = s.state()
    assert learned > 16  # past the first 16, the learning budget still lets new shapes in
    assert 0.008 * st.forward_seconds <= st.attribution_seconds <= 0.01 * st.forward_seconds + 0.003


def test_no_learning_budget_means_only_the_budget_picks():
    s = AttributionScheduler(every_n=1, budget=0.002, learning_budget=0.0)
    assert _drive(s, 100, lambda i: True)[1] == 0
    s = AttributionScheduler(every_n=1, budget=0.002, learning_budget=0.01, enabled=False)
    assert not s.may_learn()


def test_learning_respects_every_n():
    s = AttributionScheduler(every_n=5, budget=0.0, learning_budget=0.01)
    assert s.should_attribute()
    s.record(0.013, True, 0.0)
    assert not s.may_learn()  # 1 forward since the last attributed one, every_n 5


def test_a_service_whose_shapes_repeat_reads_a_shape_once_in_64_forwards():
    """Reading the shape costs microseconds: after checks that found known shapes, the checks back
    off to one in LEARN_WAIT_MAX forwards; a new shape brings them back at once."""
    s = AttributionScheduler(every_n=1, budget=0.0, learning_budget=0.01)
    s.record(0.01, s.should_attribute(), 0.0)  # the first forward: the budget's own pick
    looks = 0
    for _ in range(2000):
        if s.may_learn():
            looks += 1
            s.known()
        s.record(0.01, False, 0.0)
    assert looks < 2000 / AttributionScheduler.LEARN_WAIT_MAX + 8
    while not s.may_learn():
        s.record(0.01, False, 0.0)
    assert s.claim("prefill")  # a new shape: the next forward is looked at again
    s.record(0.013, True, 0.0)
    assert s.may_learn()


def test_each_kind_of_shape_has_its_own_first_forwards():
    """A generate() service: every decode step is a new cache length. Its decode steps must not take
    the first forwards its prompts need."""
    s = AttributionScheduler(every_n=1, budget=0.0, learning_budget=0.0001)
    s.record(0.01, s.should_attribute(), 0.0)
    for _ in range(AttributionScheduler.LEARN_FIRST):
        assert s.may_learn() and s.claim("decode")
        s.record(0.013, True, 0.0)
    assert not s.claim("decode")  # the decode steps' own are spent, and the learning budget is
    s.record(0.01, False, 0.0)
    assert not s.may_learn()  # a new shape it had no room for: the next look waits a forward
    s.record(0.01, False, 0.0)
    assert s.may_learn() and s.claim("prefill")  # the prompts still have theirs


def test_forwards_attributed_on_demand_are_overhead_but_not_the_samplings_to_pay_back():
    # GIVEN the shipped budget and traffic at 10 ms a forward, 20 ms when attributed
    def run(on_demand_first: int) -> int:
        s = AttributionScheduler(every_n=1, budget=0.01)
        for _ in range(on_demand_first):  # a measuring window (or a capture) attributed these
            s.record(0.020, True, 0.0, on_demand=True)
        picked = 0
        for _ in range(5000):
            a = s.should_attribute()
            s.record(0.020 if a else 0.010, a, 0.0)
            picked += a
        return picked
    # WHEN 500 forwards were attributed on demand before the traffic (5 s of cost)
    # THEN the sampling afterwards attributes as many forwards as without them, not none
    assert abs(run(500) - run(0)) <= 3, (run(500), run(0))
    s = AttributionScheduler(every_n=1, budget=0.01)
    s.record(0.020, True, 0.0, on_demand=True)
    s.record(0.010, False, 0.0)
    s.record(0.020, True, 0.0, on_demand=True)
    st = s.state()
    assert st.attributed == 2 and st.attribution_seconds > 0  # counted as overhead all the same
