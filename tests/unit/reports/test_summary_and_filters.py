"""What the summary says about overhead, and filters that select nothing."""
from __future__ import annotations

import logging
import re

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.attribution.scheduler import AttributionScheduler
from memprof_otel.attribution.selection import filters_selecting_nothing
from memprof_otel.reports.summary import steady_overhead_ratio

PATHS = ["", "encoder", "encoder.layer", "encoder.layer.0", "encoder.layer.0.attn", "head"]


def test_steady_overhead_leaves_the_first_forward_out():
    s = AttributionScheduler(every_n=1, budget=0.002)
    s.record(0.050, attributed=True, self_timed_s=0.001)   # first forward: charged whole (50 ms) ...
    assert s.state().first_attributed_s == pytest.approx(0.050)
    assert steady_overhead_ratio(s.state()) is None         # nothing steady to say yet
    for _ in range(99):
        s.record(0.010, attributed=False, self_timed_s=0.00001)  # 10 us of root hooks per 10 ms
    st = s.state()
    total = st.attribution_seconds / (st.attribution_seconds + st.forward_seconds)
    steady = steady_overhead_ratio(st)
    assert total > 0.02                                     # what the summary used to print
    assert steady == pytest.approx(0.001, rel=0.01)         # 10 us / 10 ms
    # ... until a plain forward is seen: then at most 3 plain forwards (30 ms), not the cold 50
    assert st.first_attributed_s == pytest.approx(0.030, rel=0.01)
    assert st.first_forward_s == pytest.approx(0.020, rel=0.01)


def test_summary_text_explains_the_first_forward_and_shows_the_steady_figure():
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(2, 16)
    with mp.instrument(m, name="summ") as h:
        m(x)
        one = h.summary()
        for _ in range(20):
            m(x)
        many = h.summary()
        d = h.summary_dict()
        st = h.scheduler.state()
    assert "100" not in one.splitlines()[1] and "not measured yet" in one
    assert "first forward is always attributed" in one
    m2 = re.search(r"overhead: ([0-9.]+)% of forward time after the first forward", many)
    assert m2, many
    assert float(m2.group(1)) / 100 == pytest.approx(d["steady_overhead_ratio"], abs=1e-5)
    # the steady figure leaves the first forward out, on both sides of the ratio (a comparison of
    # the two ratios would be a timing race: which forwards get attributed is up to the clock)
    spent = st.attribution_seconds - st.first_attributed_s
    plain = st.forward_seconds - st.first_forward_s
    assert d["steady_overhead_ratio"] == pytest.approx(spent / (spent + plain))
    assert d["overhead_ratio"] == pytest.approx(st.attribution_seconds / (st.attribution_seconds + st.forward_seconds))


def test_a_budget_of_1_is_not_printed_as_a_measured_overhead():
    """overhead_budget 1.0 attributes every forward: none runs plain, so there is nothing to take an
    attributed forward's cost against, and each is charged whole (the ratio would be 100 %)."""
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(2, 16)
    with mp.instrument(m, name="every", attribution={"overhead_budget": 1.0}) as h:
        for _ in range(5):
            m(x)
        text, d, st = h.summary(), h.summary_dict(), h.scheduler.state()
    assert st.attributed == st.forwards == 5 and st.plain_forward_ema_s is None
    line = text.splitlines()[1]
    assert "%" not in line and "not measured" in line and "every forward was attributed" in line, line
    assert d["steady_overhead_ratio"] is None
    # every other forward plain: the same budget is measured, and printed as such
    m2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with mp.instrument(m2, name="half", attribution={"overhead_budget": 1.0, "every_n_forwards": 2}) as h2:
        for _ in range(6):
            m2(x)
        text2, d2 = h2.summary(), h2.summary_dict()
    assert d2["steady_overhead_ratio"] is not None
    shown = re.search(r"overhead: ([0-9.]+)% of forward time", text2)
    assert shown and float(shown.group(1)) / 100 == pytest.approx(d2["steady_overhead_ratio"], abs=1e-5)


@pytest.mark.parametrize("kw, fragment", [
    ({"include": ("decoder.*",)}, "include pattern 'decoder.*' matches no module path"),
    ({"include": ("encoder*", "haed")}, "include pattern 'haed'"),
    ({"include": ("encoder.layer.0.attn",), "max_depth": 2}, "include pattern 'encoder.layer.0.attn'"),
    ({"exclude": ("*",)}, "exclude ['*'] excludes every module path"),
    ({"max_depth": 0}, "max_depth 0 tracks the root module only"),
])
def test_filters_selecting_nothing_are_named(kw: dict, fragment: str):
    args = {"max_depth": None, "include": (), "exclude": (), **kw}
    problems = filters_selecting_nothing(PATHS, **args)
    assert len(problems) == 1 and fragment in problems[0], problems


@pytest.mark.parametrize("kw", [{}, {"include": ("encoder*",)}, {"exclude": ("head",)}, {"max_depth": 1}])
def test_filters_that_select_something_are_quiet(kw: dict):
    args = {"max_depth": None, "include": (), "exclude": (), **kw}
    assert filters_selecting_nothing(PATHS, **args) == []
    assert filters_selecting_nothing([""], max_depth=0, include=("x",), exclude=()) == []


def test_instrument_warns_once_naming_the_filter(caplog: pytest.LogCaptureFixture):
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with caplog.at_level(logging.WARNING, logger="memprof_otel"):
        with mp.instrument(m, name="typo", include=("encoder.*",)) as h:
            for _ in range(3):
                m(torch.randn(1, 4))
            assert set(h.layer_stats()) <= {""}
    lines = [r.getMessage() for r in caplog.records if "matches no module path" in r.getMessage()]
    assert len(lines) == 1
    assert "'typo'" in lines[0] and "'encoder.*'" in lines[0] and "'0'" in lines[0]
