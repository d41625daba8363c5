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


def test_scheduler_charges_self_timed_cost_of_plain_forwards():
    s = AttributionScheduler(every_n=1, budget=0.0)
    s.record(0.01, False, 0.001)
    assert abs(s.state().attribution_seconds - 0.001) < 1e-12
    assert not s.should_attribute()
