import json
import math

import pytest

from memprof_otel.watchdog.engine import AlertEngine, Transition, condition_holds
from memprof_otel.watchdog.rules import RULE_OPS, WatchdogRule, parse_rule

RSS = "memprof_process_resident_memory_bytes"
ALLOC = "memprof_allocator_allocated_bytes"


def rule(name="high_rss", metric=RSS, op=">", threshold=100.0, for_seconds=0.0, severity="warning",
         labels=()):
    return WatchdogRule(name, metric, op, threshold, for_seconds, severity, ("log",), tuple(sorted(labels)))


def rss(v):
    return {RSS: [({}, v)]}


def steps(tr):
    return [(t.old, t.new) for t in tr]


def test_for_zero_fires_in_the_same_evaluation():
    eng = AlertEngine([rule()])
    tr = eng.evaluate(rss(150.0), now=10.0)
    assert steps(tr) == [("inactive", "firing")]
    assert tr[0] == Transition(eng.rules[0], {}, "inactive", "firing", 150.0, 10.0)
    assert eng.active_count("high_rss") == 1
    assert eng.alerts()[0]["since"] == eng.alerts()[0]["active_since"] == 10.0


def test_pending_becomes_firing_once_for_has_elapsed():
    eng = AlertEngine([rule(for_seconds=30)])
    assert steps(eng.evaluate(rss(150.0), now=0.0)) == [("inactive", "pending")]
    assert eng.evaluate(rss(160.0), now=29.9) == []
    assert eng.active_count("high_rss") == 0
    assert eng.alerts()[0]["state"] == "pending" and eng.alerts()[0]["value"] == 160.0
    tr = eng.evaluate(rss(170.0), now=30.0)
    assert steps(tr) == [("pending", "firing")] and tr[0].value == 170.0 and tr[0].at == 30.0
    a = eng.alerts()[0]
    assert (a["state"], a["since"], a["active_since"]) == ("firing", 30.0, 0.0)
    assert eng.active_count("high_rss") == 1


def test_flapping_pending_drops_to_inactive_without_firing():
    eng = AlertEngine([rule(for_seconds=30)])
    seen = []
    for t, v in [(0, 150.0), (10, 50.0), (20, 150.0), (40, 50.0), (45, 150.0), (60, 150.0)]:
        seen += steps(eng.evaluate(rss(v), now=float(t)))
    assert seen == [("inactive", "pending"), ("pending", "inactive"), ("inactive", "pending"),
                    ("pending", "inactive"), ("inactive", "pending")]
    assert eng.fired_total() == {("high_rss", "warning"): 0}
    assert eng.alerts()[0]["active_since"] == 45.0  # the hold restarts after each drop


def test_firing_resolves_then_is_dropped_after_retention():
    eng = AlertEngine([rule()], resolved_retention_s=100)
    eng.evaluate(rss(150.0), now=0.0)
    tr = eng.evaluate(rss(90.0), now=5.0)
    assert steps(tr) == [("firing", "resolved")] and tr[0].value == 90.0
    assert eng.active_count("high_rss") == 0
    a = eng.alerts()[0]
    assert (a["state"], a["since"], a["value"]) == ("resolved", 5.0, 90.0)
    assert eng.evaluate(rss(80.0), now=104.9) == []
    assert eng.alerts()[0]["value"] == 80.0
    assert steps(eng.evaluate(rss(80.0), now=105.0)) == [("resolved", "inactive")]
    assert eng.alerts() == []


def test_resolved_instance_goes_back_to_pending_or_straight_to_firing():
    eng = AlertEngine([rule(for_seconds=10)])
    eng.evaluate(rss(150.0), now=0.0)
    eng.evaluate(rss(150.0), now=10.0)
    eng.evaluate(rss(50.0), now=20.0)
    assert steps(eng.evaluate(rss(150.0), now=25.0)) == [("resolved", "pending")]
    assert eng.alerts()[0]["active_since"] == 25.0
    assert steps(eng.evaluate(rss(150.0), now=35.0)) == [("pending", "firing")]

    eng0 = AlertEngine([rule()])
    eng0.evaluate(rss(150.0), now=0.0)
    eng0.evaluate(rss(50.0), now=1.0)
    assert steps(eng0.evaluate(rss(150.0), now=2.0)) == [("resolved", "firing")]
    assert eng0.fired_total() == {("high_rss", "warning"): 2}


def test_each_label_set_is_its_own_instance_and_matchers_filter():
    per_device = rule("alloc_high", ALLOC, ">", 1e9)
    cuda0 = rule("cuda0_high", ALLOC, ">", 1e9, labels=[("device", "cuda:0")])
    eng = AlertEngine([per_device, cuda0])
    values = {ALLOC: [({"device": "cpu"}, 3e9), ({"device": "cuda:0"}, 5e9), ({"device": "cuda:1"}, 1e8)]}
    tr = eng.evaluate(values, now=1.0)
    assert sorted((t.rule.name, t.labels["device"]) for t in tr) == [
        ("alloc_high", "cpu"), ("alloc_high", "cuda:0"), ("cuda0_high", "cuda:0")]
    assert eng.active_count("alloc_high") == 2 and eng.active_count("cuda0_high") == 1
    # one series clears; the other stays firing
    values = {ALLOC: [({"device": "cpu"}, 1e8), ({"device": "cuda:0"}, 5e9)]}
    tr = eng.evaluate(values, now=2.0)
    assert [(t.rule.name, t.labels, t.new) for t in tr] == [("alloc_high", {"device": "cpu"}, "resolved")]
    assert eng.active_count("alloc_high") == 1


def test_matcher_needs_every_label_pair():
    r = rule("m", ALLOC, ">", 0.0, labels=[("device", "cuda:0"), ("model", "bert")])
    eng = AlertEngine([r])
    values = {ALLOC: [({"device": "cuda:0"}, 5.0), ({"device": "cuda:0", "model": "gpt"}, 5.0),
                      ({"device": "cuda:0", "model": "bert", "pool": "large"}, 5.0)]}
    tr = eng.evaluate(values, now=0.0)
    assert [t.labels for t in tr] == [{"device": "cuda:0", "model": "bert", "pool": "large"}]


@pytest.mark.parametrize("op,below,equal,above", [
    (">", False, False, True), (">=", False, True, True), ("<", True, False, False), ("<=", True, True, False)])
def test_ops(op, below, equal, above):
    r = rule(op=op, threshold=100.0)
    assert [condition_holds(r, v) for v in (99.0, 100.0, 101.0)] == [below, equal, above]
    eng = AlertEngine([r])
    assert bool(eng.evaluate(rss(101.0), now=0.0)) is above


def test_every_config_op_is_supported():
    for op in RULE_OPS:
        assert condition_holds(rule(op=op), 0.0) in (True, False)


@pytest.mark.parametrize("op", RULE_OPS)
def test_nan_never_matches_and_resolves_a_firing_alert(op):
    eng = AlertEngine([rule(op=op, threshold=100.0)])
    assert eng.evaluate(rss(math.nan), now=0.0) == []
    assert eng.alerts() == []
    firing_value = 0.0 if op.startswith("<") else 1e3
    eng.evaluate(rss(firing_value), now=1.0)
    assert steps(eng.evaluate(rss(math.nan), now=2.0)) == [("firing", "resolved")]
    assert eng.alerts()[0]["value"] is None  # JSON has no NaN


def test_missing_metric_gives_no_instances_and_disappearing_series_resolve_or_drop():
    eng = AlertEngine([rule("fast"), rule("slow", for_seconds=60)])
    assert eng.evaluate({}, now=0.0) == []
    eng.evaluate(rss(150.0), now=1.0)
    assert {a["rule"]: a["state"] for a in eng.alerts()} == {"fast": "firing", "slow": "pending"}
    tr = eng.evaluate({"memprof_other": [({}, 1.0)]}, now=2.0)
    assert [(t.rule.name, t.old, t.new, t.value) for t in tr] == [
        ("fast", "firing", "resolved", 150.0), ("slow", "pending", "inactive", 150.0)]


def test_non_numeric_value_counts_as_nan():
    eng = AlertEngine([rule()])
    assert eng.evaluate({RSS: [({}, "oops")]}, now=0.0) == []


def test_set_rules_keeps_identical_rules_and_resets_changed_ones():
    a, b, c = rule("a", for_seconds=0), rule("b", for_seconds=0), rule("c", for_seconds=0)
    eng = AlertEngine([a, b, c])
    eng.evaluate(rss(150.0), now=0.0)
    assert eng.fired_total() == {("a", "warning"): 1, ("b", "warning"): 1, ("c", "warning"): 1}
    b2 = rule("b", threshold=120.0)          # changed definition: starts over
    a_same = rule("a", for_seconds=0)        # equal definition (a new but identical object)
    eng.set_rules([a_same, b2])              # c removed
    assert eng.rules == (a_same, b2)
    assert [(x["rule"], x["state"], x["since"]) for x in eng.alerts()] == [("a", "firing", 0.0)]
    assert eng.active_count("b") == 0 and eng.active_count("c") == 0
    assert eng.fired_total() == {("a", "warning"): 1, ("b", "warning"): 1}  # counters stay monotonic
    tr = eng.evaluate(rss(150.0), now=5.0)
    assert [(t.rule.name, t.old, t.new) for t in tr] == [("b", "inactive", "firing")]
    assert eng.fired_total() == {("a", "warning"): 1, ("b", "warning"): 2}


def test_set_rules_with_a_new_severity_starts_a_new_counter():
    eng = AlertEngine([rule("a")])
    eng.evaluate(rss(150.0), now=0.0)
    eng.set_rules([rule("a", severity="critical")])
    assert eng.fired_total() == {("a", "critical"): 0}
    assert eng.alerts() == []


def test_set_rules_rejects_duplicates_and_bad_ops():
    eng = AlertEngine()
    with pytest.raises(ValueError, match="unique"):
        eng.set_rules([rule("a"), rule("a")])
    with pytest.raises(ValueError, match="op"):
        eng.set_rules([rule(op="==")])
    with pytest.raises(TypeError):
        eng.set_rules([{"name": "a"}])
    assert eng.rules == ()


def test_fired_total_counts_transitions_into_firing_per_rule_and_severity():
    eng = AlertEngine([rule("a", severity="critical"), rule("b", threshold=1e9)])
    assert eng.fired_total() == {("a", "critical"): 0, ("b", "warning"): 0}
    for t, v in enumerate([150.0, 150.0, 50.0, 150.0, 50.0, 150.0]):
        eng.evaluate(rss(v), now=float(t))
    assert eng.fired_total() == {("a", "critical"): 3, ("b", "warning"): 0}


def test_alerts_shape_is_json_ready():
    r = parse_rule({"name": "gpu", "metric": ALLOC, "op": ">=", "threshold": "20GiB", "for": "1m",
                    "severity": "critical", "labels": {"device": "cuda:0"}}, "watchdog.rules[0]")
    eng = AlertEngine([r])
    eng.evaluate({ALLOC: [({"device": "cuda:0", "model": "m"}, 30 * 2**30)]}, now=1000.0)
    out = eng.alerts()
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert out == [{"rule": "gpu", "severity": "critical", "state": "pending", "since": 1000.0,
                    "active_since": 1000.0, "value": float(30 * 2**30), "threshold": float(20 * 2**30),
                    "op": ">=", "metric": ALLOC, "labels": {"device": "cuda:0", "model": "m"}}]


def test_alerts_are_ordered_by_rule_then_labels():
    eng = AlertEngine([rule("z", ALLOC, threshold=0.0), rule("a", ALLOC, threshold=0.0)])
    eng.evaluate({ALLOC: [({"device": "cuda:1"}, 1.0), ({"device": "cpu"}, 1.0)]}, now=0.0)
    assert [(a["rule"], a["labels"]["device"]) for a in eng.alerts()] == [
        ("z", "cpu"), ("z", "cuda:1"), ("a", "cpu"), ("a", "cuda:1")]


def test_negative_retention_is_rejected():
    with pytest.raises(ValueError):
        AlertEngine(resolved_retention_s=-1)
