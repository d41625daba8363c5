"""The diff and its gate over crafted baselines: every expected figure is plain arithmetic on the
baselines' numbers."""
from __future__ import annotations

import json

import pytest

from memprof_otel.baselines import Baseline, LayerBaseline, Thresholds, diff
from memprof_otel.baselines.render import markdown, text

KIB = 1024


def base(layers: dict[str, tuple[int, int]], sigs: dict[str, str] | None = None, **env: str) -> Baseline:
    sigs = sigs or {}
    return Baseline(model="net", fingerprint="sha256:" + str(sorted(sigs.items())),
                    layers=tuple(LayerBaseline(p, sigs.get(p, f"T{p}()"), peak, ret, 1, 1, 1)
                                 for p, (peak, ret) in layers.items()),
                    environment={"device": "cpu", "torch": "2.13.0", **env})


OLD = {"": (1000 * KIB, 10 * KIB), "enc": (800 * KIB, 8 * KIB), "enc.attn": (600 * KIB, 4 * KIB),
       "head": (100 * KIB, 2 * KIB)}


def test_identical_baselines_have_no_change_and_never_fail() -> None:
    d = diff(base(OLD), base(OLD), Thresholds(fail_above=0.0, fail_above_bytes=0))
    assert d.unchanged and not d.failures and not d.environment and not d.structure_changed
    assert "no change" in text(d)


def test_growth_ranked_by_bytes_with_relative_change_and_thresholds() -> None:
    new = dict(OLD, **{"enc.attn": (612 * KIB, 4 * KIB), "head": (130 * KIB, 2 * KIB), "": (1012 * KIB, 10 * KIB),
                       "enc": (812 * KIB, 8 * KIB)})
    d = diff(base(OLD), base(new), Thresholds(fail_above=0.02))
    # ranked by |delta|: head +30 KiB first, then the three +12 KiB in path order
    assert [(c.layer, c.delta) for c in d.changes] == [("head", 30 * KIB), ("", 12 * KIB), ("enc", 12 * KIB),
                                                       ("enc.attn", 12 * KIB)]
    assert d.changes[0].relative == pytest.approx(30 / 100)
    # 2 %: head (+30 %) fails; enc.attn +2.0 % exactly does not (growth must exceed), root +1.2 % not
    assert [c.layer for c in d.failures] == ["head"]
    assert [c.layer for c in diff(base(OLD), base(new), Thresholds(fail_above=0.0199)).failures] == ["head", "enc.attn"]
    # with an absolute floor too, a figure must exceed both
    assert [c.layer for c in diff(base(OLD), base(new), Thresholds(0.0199, 20 * KIB)).failures] == ["head"]
    assert [c.layer for c in diff(base(OLD), base(new), Thresholds(None, 12 * KIB - 1)).failures] == [
        "head", "", "enc", "enc.attn"]


def test_shrinking_never_fails_and_growth_from_zero_fails_any_relative_threshold() -> None:
    smaller = dict(OLD, head=(50 * KIB, 0))
    d = diff(base(OLD), base(smaller), Thresholds(fail_above=0.0))
    assert not d.failures and {c.figure for c in d.changes} == {"peak_increase_bytes", "retained_bytes"}
    d = diff(base(smaller), base(OLD), Thresholds(fail_above=0.5))
    [ret] = [c for c in d.failures if c.figure == "retained_bytes"]
    assert ret.relative is None and ret.delta == 2 * KIB and "new" in text(d)


def test_a_renamed_layer_is_matched_and_its_figures_compared() -> None:
    sigs_old = {"": "Net()", "enc": "Enc()", "enc.attn": "Attn(w=float32[8,8])", "head": "Lin()"}
    renamed = {"": OLD[""], "encoder": OLD["enc"], "encoder.attn": (700 * KIB, 4 * KIB), "head": OLD["head"]}
    sigs_new = {"": "Net()", "encoder": "Enc()", "encoder.attn": "Attn(w=float32[8,8])", "head": "Lin()"}
    d = diff(base(OLD, sigs_old), base(renamed, sigs_new), Thresholds(fail_above=0.02))
    assert d.renamed == (("enc", "encoder"), ("enc.attn", "encoder.attn"))
    assert not d.added and not d.removed and d.structure_changed
    [c] = d.changes
    assert (c.layer, c.old_layer, c.delta, c.exceeds) == ("encoder.attn", "enc.attn", 100 * KIB, True)
    assert "encoder.attn (was enc.attn)" in text(d) and "renamed: enc -> encoder" in text(d)


def test_added_and_removed_layers_are_listed_not_failed() -> None:
    new = {k: v for k, v in OLD.items() if k != "head"} | {"norm": (5 * KIB, 0)}
    d = diff(base(OLD), base(new), Thresholds(fail_above=0.0))
    assert [lay.path for lay in d.added] == ["norm"] and [lay.path for lay in d.removed] == ["head"]
    assert not d.failures
    assert "added: norm (peak increase 5.0 KiB)" in text(d) and "removed: head" in text(d)


def test_environment_differences_are_listed() -> None:
    d = diff(base(OLD, attention="sdpa"), base(OLD, attention="eager", torch="2.14.0"))
    assert d.environment == {"attention": ("sdpa", "eager"), "torch": ("2.13.0", "2.14.0")}
    assert "environment attention: sdpa -> eager" in text(d)


def test_json_and_markdown_say_the_same() -> None:
    new = dict(OLD, head=(130 * KIB, 2 * KIB))
    d = diff(base(OLD), base(new), Thresholds(fail_above=0.02, fail_above_bytes=KIB))
    doc = json.loads(json.dumps(d.to_dict()))
    assert doc["failed"] is True and doc["thresholds"] == {"fail_above": 0.02, "fail_above_bytes": KIB}
    assert doc["changes"] == [{"layer": "head", "old_layer": "head", "figure": "peak_increase_bytes",
                               "old": 100 * KIB, "new": 130 * KIB, "delta": 30 * KIB, "relative": 0.3,
                               "exceeds": True, "shape": None, "noise": 0}]
    assert doc["per_shape"] is False
    md = markdown(d)
    assert md.startswith("### :x: memprof-otel diff: FAIL: 1 figure grew by more than 2.00% and 1.0 KiB")
    assert "| `head` | peak increase | 100.0 KiB (102,400 B) | 130.0 KiB (133,120 B) | +30.0 KiB | +30.0% | **FAIL** |" in md
