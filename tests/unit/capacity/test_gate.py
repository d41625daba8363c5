"""What a gate relies on: every kind of call learnt, a typo never a silent yes, answers outside the
shapes seen that say how far out they are and carry an error that grows with it, a table for every
model with a batch, and a CLI whose exit status tells "cannot tell" from "fits"."""
from __future__ import annotations

from typing import Any, NamedTuple

import pytest

import memprof_otel as mp
from memprof_otel.capacity.memory_budget import PROCESS_RESIDENT, MemoryBudget
from memprof_otel.capacity.model import GROWTH_FLOOR, MemoryModel
from memprof_otel.capacity.service import Capacity
from memprof_otel.cli import main
from memprof_otel.cli.headroom import EXIT_CANNOT_ANSWER, EXIT_WOULD_NOT_FIT, exit_code, render
from memprof_otel.config import CapacityConfig


def prompt(b: int, s: int) -> int:
    return 2_000_000 + 9_000 * b * s + 40 * b * s * s


def decode(b: int, c: int) -> int:
    return 300_000 + 20_000 * b + 500 * b * c


def fresh(**kw: Any) -> MemoryModel:
    m = MemoryModel(refit_interval_s=0, **kw)
    m.background = False
    return m


PROMPTS = [(b, s) for b in (1, 2, 4, 8) for s in (16, 64, 128)]
STEPS = [(b, c) for b in (1, 2, 4, 8) for c in (20, 60, 100, 140)]


def plain_forwards(m: MemoryModel) -> None:
    for b, s in PROMPTS:
        m.observe({"batch": b, "seq_len": s}, prompt(b, s), 0)


def generate_calls(m: MemoryModel) -> None:
    """generate(): its prompt passes an empty cache (cache_len 0), then one step per new token."""
    for b, s in PROMPTS[::2]:
        m.observe({"batch": b, "seq_len": s, "cache_len": 0}, prompt(b, s), 0)
    for b, c in STEPS:
        m.observe({"batch": b, "seq_len": 1, "cache_len": c}, decode(b, c), 0)


@pytest.mark.parametrize("order", ["generate first", "plain first"])
def test_plain_forwards_and_generate_calls_are_both_learnt_in_either_order(order: str) -> None:
    m = fresh()
    for feed in ((generate_calls, plain_forwards) if order == "generate first" else (plain_forwards, generate_calls)):
        feed(m)
    assert m.mixed_features == 0 and m.kinds_note() is None  # one kind of call
    assert set(m.describe()["regimes"]) == {"prefill", "decode"}
    assert m.describe()["features"] == ["batch", "cache_len", "seq_len"]
    p = m.predict({"batch": 3, "seq_len": 100})  # a plain forward: a prompt
    assert p.reason is None and p.peak_bytes == pytest.approx(prompt(3, 100), rel=1e-6)
    assert m.predict({"batch": 3, "seq_len": 100, "cache_len": 0}).peak_bytes == p.peak_bytes
    d = m.predict({"batch": 2, "seq_len": 1, "cache_len": 100})
    assert d.reason is None and d.regime == "decode" and d.peak_bytes == pytest.approx(decode(2, 100), rel=1e-6)


def test_generate_prompts_cut_logits_and_plain_forwards_of_one_model_fit_together() -> None:
    """generate() computes one position's logits (logits_to_keep=1); a plain forward all of them: a
    b * positions * vocabulary term the features tell apart."""
    vocab = 5_000

    def lm(b: int, s: int, logits: int) -> int:
        return 1_000_000 + 3_000 * b * s + 4 * vocab * b * logits

    m = fresh()
    for b, s in PROMPTS:
        m.observe({"batch": b, "seq_len": s}, lm(b, s, s), 0)
    for b, s in PROMPTS[1::2]:
        m.observe({"batch": b, "seq_len": s, "logits": 1}, lm(b, s, 1), 0)
    assert m.kinds_note() is None
    assert m.predict({"batch": 3, "seq_len": 100}).peak_bytes == pytest.approx(lm(3, 100, 100), rel=1e-3)
    assert m.predict({"batch": 3, "seq_len": 100, "logits": 1}).peak_bytes == pytest.approx(lm(3, 100, 1), rel=1e-3)


def test_the_error_grows_with_the_distance_outside_the_shapes_seen() -> None:
    """The truth has a batch^2 term the batch-only family cannot fit: fitted on batches 1..4, the
    answers at 8, 16 and 32 each say how far out they are, and carry more error the farther out
    (at least GROWTH_FLOOR per multiple, more where the shapes left out showed more). How well that
    covers real models is measured in tests/integration/test_capacity_gate.py."""
    def truth(b: int) -> int:
        return 1_000_000 + 100_000 * b + 3_000 * b * b

    m = fresh()
    for b in (1, 2, 3, 4):
        m.observe({"batch": b}, truth(b), 0)
    st = m.state()
    assert st.reason is None and st.error_growth >= GROWTH_FLOOR
    errors = []
    for b in (8, 16, 32):
        p = m.predict({"batch": b})
        assert p.extrapolates and p.extrapolation_factor == pytest.approx(b / 4)
        assert p.error_ratio >= st.error_ratio + st.error_growth * (b / 4 - 1) - 1e-4
        assert p.upper_bytes == pytest.approx(p.peak_bytes * (1 + p.error_ratio), abs=2)
        errors.append(p.error_ratio)
    assert errors == sorted(errors) and errors[0] < errors[-1]
    inside = m.predict({"batch": 3})
    assert inside.extrapolation_factor == 1.0 and not inside.extrapolates and inside.error_ratio == st.error_ratio


def test_too_few_shapes_never_asks_for_more_to_fit_the_constant() -> None:
    m = fresh()
    m.observe({"batch": 2, "seq_len": 8}, 5000, 0)
    why = m.predict({"batch": 2, "seq_len": 8}).reason
    assert "more needed to fit 1" not in why
    assert "1 distinct shape seen, all with the same batch, seq_len" in why


class FixedBudget:
    """A budget reader answering one fixed budget (or none)."""

    def __init__(self, available: int | None) -> None:
        self.available = available

    def read(self, device: str) -> tuple[MemoryBudget | None, str | None]:
        if self.available is None:
            return None, "no limit here"
        return MemoryBudget(device, "configured", self.available, 0, 0, 0), None


def capacity(available: int | None = 10 ** 9, shape_of: Any = None, **cfg: Any) -> Capacity:
    cap = Capacity(CapacityConfig(**cfg), shape_of, budgets=FixedBudget(available))  # type: ignore[arg-type]
    for mm in (cap.model, cap.kernel):
        mm.refit_interval_s, mm.background = 0, False
    return cap


def test_fits_raises_on_a_typo_or_a_missing_feature_whatever_unknown_says() -> None:
    cap = capacity()
    with pytest.raises(mp.ShapeError, match="seqlen"):  # before any forward: not a default feature name
        cap.fits("cpu", {"batch": 4, "seqlen": 64}, unknown=True)
    assert cap.fits("cpu", {"batch": 4, "seq_len": 64}, unknown=True) is True  # nothing learnt: unknown
    for b, s in PROMPTS:
        cap.observe({"batch": b, "seq_len": s}, prompt(b, s), 0)
    with pytest.raises(mp.ShapeError, match=r"unknown feature \[seqlen\]"):
        cap.fits("cpu", {"batch": 4, "seqlen": 64}, unknown=True)
    with pytest.raises(mp.ShapeError, match=r"missing feature \[seq_len\]"):
        cap.fits("cpu", {"batch": 4}, unknown=True)
    with pytest.raises(mp.ShapeError, match="batch must be at least 1"):
        cap.predict({"batch": 0, "seq_len": 4})
    with pytest.raises(mp.ShapeError):
        cap.answer("cpu", {"batch": 4})
    assert cap.fits("cpu", {"batch": 4, "seq_len": 64}) is True
    # the decode regime has not been measured: that is "cannot answer yet", not a shape error
    assert cap.fits("cpu", {"batch": 4, "seq_len": 1, "cache_len": 50}, unknown=False) is False
    assert "no decode step" in cap.predict({"batch": 4, "seq_len": 1, "cache_len": 50}).reason
    assert capacity(None).fits("cpu", {"batch": 4, "seq_len": 64}, unknown=False) is False  # no limit: unknown


def test_table_rows_say_how_far_out_they_are_and_stop_at_max_extrapolation() -> None:
    cap = capacity(10 ** 12, seq_lens=(16, 128, 2048), max_extrapolation=8.0)
    for b, s in PROMPTS:
        cap.observe({"batch": b, "seq_len": s}, prompt(b, s), 0)
    doc = cap.answer("cpu", None)
    rows = {r["seq_len"]: r for r in doc["max_safe_batch_rows"]}
    # a terabyte: far past 8 x the largest batch seen (8) at every length: not known, at least 64
    assert rows[16]["batch"] is None and rows[16]["at_least"] == 64 and "not known" in rows[16]["reason"]
    assert rows[16]["extrapolation_factor"] == 8.0
    assert rows[2048]["batch"] is None and "16x" in rows[2048]["reason"]  # 2048 is 16 x the longest seen
    assert doc["max_safe_batch"] == {"16": None, "128": None, "2048": None}
    cap.budgets = FixedBudget(12_000_000)
    rows = {r["seq_len"]: r for r in cap.answer("cpu", None)["max_safe_batch_rows"]}
    assert rows[16]["batch"] > 8 and rows[128]["batch"] < 8  # one row outside the batches seen, one inside
    for s in (16, 128):
        n, f = rows[s]["batch"], rows[s]["extrapolation_factor"]
        assert n is not None and f == pytest.approx(max(1.0, n / 8))
        # plain arithmetic: batch n fits with the error at its distance, n + 1 does not
        st = cap.model.state()
        assert prompt(n, s) * (1 + st.error_at(f)) <= 12_000_000
        assert prompt(n + 1, s) * (1 + st.error_at(max(1.0, (n + 1) / 8))) > 12_000_000
    text = render({"models": {"m": cap.answer("cpu", None)}})
    assert "seq_len 16:" in text and "outside the shapes seen" in text
    assert cap.max_safe_batches(12_000_000) == {s: rows[s]["batch"] for s in (16, 128)}  # the gauges
    assert cap.max_safe_batches(10 ** 12)[16] == 64  # past max_extrapolation: the batch known to fit


def test_every_answer_past_max_extrapolation_is_not_known_and_fits_is_the_callers_choice() -> None:
    """One answer: the table, predict, fits, headroom and the ready gauge agree. Fitted on batches
    1-8, a batch of 100 (12.5x) is not known to any of them; fits() is then the caller's
    ``unknown=``, unless the fit's own estimate (no error on top) is already over what is
    available: then it does not fit, whatever ``unknown`` says."""
    cap = capacity(10 ** 12, max_extrapolation=8.0)
    assert cap.figures("cpu").ready is False  # nothing learnt yet: the gauge says 0
    for b, s in PROMPTS:
        cap.observe({"batch": b, "seq_len": s}, prompt(b, s), 0)
    cap.model.states(force=True)  # the refit a second later, now
    assert cap.figures("cpu").ready is True
    p = cap.predict({"batch": 100, "seq_len": 64})
    assert p.upper_bytes is None and "capacity.max_extrapolation" in p.reason
    assert p.estimate_bytes == pytest.approx(prompt(100, 64), rel=1e-3)  # the fit's own figure, kept
    assert cap.fits("cpu", {"batch": 100, "seq_len": 64}, unknown=False) is False
    assert cap.fits("cpu", {"batch": 100, "seq_len": 64}, unknown=True) is True  # a terabyte: the estimate fits
    doc = cap.answer("cpu", {"batch": 100, "seq_len": 64})
    assert doc["fits"] is None and "headroom_bytes" not in doc
    row = {r["seq_len"]: r for r in cap.answer("cpu", None)["max_safe_batch_rows"]}[64]
    assert row["batch"] is None and row["at_least"] == 64  # the table: not known past 8 x 8
    inside = cap.predict({"batch": 64, "seq_len": 64})  # 8x: the last batch the table calls known
    assert inside.upper_bytes is not None and inside.reason is None
    # what is available is far below the estimate: known not to fit, with either unknown
    cap.budgets = FixedBudget(prompt(100, 64) // 10)
    for unknown in (True, False):
        assert cap.fits("cpu", {"batch": 100, "seq_len": 64}, unknown=unknown) is False
    assert cap.answer("cpu", {"batch": 100, "seq_len": 64})["fits"] is False
    cap.budgets = FixedBudget(None)
    assert cap.figures("cpu").ready is False  # no limit: the model cannot answer


def test_a_service_that_only_calls_generate_gets_a_table_of_its_prompts() -> None:
    """generate() computes one position's logits (logits_to_keep=1): a service that only calls it
    never runs a plain forward, whose logits over every position lie 64x and more outside anything
    seen. Its table and its questions without ``logits`` are about the prompts it does run, and say
    so; once a plain forward is measured, they are about plain forwards again (the larger)."""
    vocab = 5_000

    def lm(b: int, s: int, logits: int) -> int:
        return 1_000_000 + 3_000 * b * s + 4 * vocab * b * logits

    available = 8_000_000  # batch ~15 at 128, ~29 at 64: outside the batches seen, within 8x
    cap = capacity(available, seq_lens=(64, 128))
    for b, s in PROMPTS:
        cap.observe({"batch": b, "seq_len": s, "logits": 1}, lm(b, s, 1), 0)
    for b, c in STEPS:
        cap.observe({"batch": b, "seq_len": 1, "cache_len": c, "logits": 1}, decode(b, c), 0)
    cap.model.states(force=True)
    doc = cap.answer("cpu", None)
    assert doc["table_call"]["kind"] == "generate" and doc["table_call"]["logits"] == 1
    rows = {r["seq_len"]: r for r in doc["max_safe_batch_rows"]}
    st = cap.model.state()
    for s in (64, 128):  # known, and by plain arithmetic on the prompts' own peak
        n = rows[s]["batch"]
        assert n is not None and n > 8 and rows[s]["reason"] is None, rows[s]
        assert lm(n, s, 1) * (1 + st.error_at(n / 8)) <= available < lm(n + 1, s, 1) * (1 + st.error_at((n + 1) / 8))
    p = cap.predict({"batch": 8, "seq_len": 128})  # no logits given: a prompt of the calls it runs
    assert p.features["logits"] == 1 and p.peak_increase_bytes == pytest.approx(lm(8, 128, 1), rel=1e-3)
    assert p.extrapolation_factor == 1.0 and p.upper_bytes is not None
    assert "generate() prompts" in render({"models": {"m": doc}})
    for b, s in PROMPTS[:3]:  # a plain forward: every position's logits, the larger
        cap.observe({"batch": b, "seq_len": s}, lm(b, s, s), 0)
    cap.model.states(force=True)
    assert cap.answer("cpu", None)["table_call"]["kind"] == "forward"
    assert "logits" not in cap.predict({"batch": 2, "seq_len": 64}).features


def test_a_model_without_a_sequence_gets_one_row_and_one_without_a_batch_a_reason() -> None:
    cap = capacity(5 * 10 ** 7, shape_of=lambda a, k: {})
    for b in (1, 2, 4, 8, 16):
        cap.observe({"batch": b}, 1000 + 700_000 * b, 0)
    doc = cap.answer("cpu", None)
    assert list(doc["max_safe_batch"]) == ["any"]
    n, st = doc["max_safe_batch"]["any"], cap.model.state()
    assert n is not None and n > 16  # outside the batches seen (1..16), within 8x of them
    assert (1000 + 700_000 * n) * (1 + st.error_at(n / 16)) <= 5 * 10 ** 7
    assert (1000 + 700_000 * (n + 1)) * (1 + st.error_at((n + 1) / 16)) > 5 * 10 ** 7
    rows = capacity(10 ** 8, shape_of=lambda a, k: {})
    for n in (1, 2, 4, 8):
        rows.observe({"rows": n}, 1000 * n, 0)
    doc = rows.answer("cpu", None)
    assert doc["max_safe_batch_rows"] == [] and "needs a feature named 'batch'" in doc["max_safe_batch_reason"]
    assert "['rows']" not in doc["max_safe_batch_reason"] and "[rows]" in doc["max_safe_batch_reason"]


def test_a_shape_of_giving_different_names_is_said_everywhere() -> None:
    cap = capacity(10 ** 9, shape_of=lambda a, k: {})
    for b in (1, 2, 4, 8):
        cap.observe({"batch": b, "pixels": 64}, 100 * b * 64, 0)
        cap.observe({"batch": b, "pixels": 256}, 100 * b * 256, 0)
        cap.observe({"batch": b}, 5000 * b, 0)
    doc = cap.answer("cpu", None)
    assert doc["note"].startswith("calls of this model give different features")
    assert "[batch, pixels] (8 forwards)" in doc["note"] and "[batch] (4 forwards)" in doc["note"]
    assert "note: calls of this model give different features" in render({"models": {"m": doc}})
    with pytest.raises(mp.ShapeError, match=r"\[batch, pixels\] or \[batch\]"):
        cap.predict({"pixels": 64})
    assert cap.predict({"batch": 3}).regime == "prefill [batch]"


def doc_of(fits: Any, enabled: bool = True) -> dict[str, Any]:
    return {"models": {"m": {"enabled": enabled, "fits": fits}}}


def test_the_cli_exit_status_tells_cannot_tell_from_fits() -> None:
    assert exit_code(doc_of(True), asked=True) == 0
    assert exit_code(doc_of(False), asked=True) == EXIT_WOULD_NOT_FIT == 3
    assert exit_code(doc_of(None), asked=True) == EXIT_CANNOT_ANSWER == 4
    assert exit_code(doc_of(True, enabled=False), asked=True) == EXIT_CANNOT_ANSWER
    assert exit_code({"models": {}}, asked=True) == EXIT_CANNOT_ANSWER
    assert exit_code(doc_of(None), asked=False) == 0  # the table alone was asked for


@pytest.mark.parametrize("args, word", [(["--batch", "0"], "at least 1"), (["--seq-len", "x"], "whole number"),
                                        (["--feature", "rows"], "NAME=VALUE")])
def test_a_bad_shape_on_the_command_line_is_one_line_and_exit_2(args: list[str], word: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["headroom", "--url", "http://127.0.0.1:9", *args]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and word in out.err and "None" not in out.err


def test_advice_notes_a_model_whose_calls_give_different_features() -> None:
    from memprof_otel.advice.service import Advisor
    from memprof_otel.telemetry.started import NOT_STARTED

    cap = capacity(shape_of=lambda a, k: {})
    cap.observe({"batch": 2, "pixels": 64}, 1000, 0)
    cap.observe({"batch": 2}, 1000, 0)

    class Handle:
        capacity = cap
        last_device = "cpu"

    advisor = Advisor(lambda: NOT_STARTED, lambda: [], {}, handles=lambda: {"vision": Handle()})
    notes = [n for n in advisor.report().notes if n.startswith("model 'vision'")]
    assert len(notes) == 1 and "[batch, pixels] (1 forward)" in notes[0] and "[batch] (1 forward)" in notes[0]
    assert notes[0] in advisor.report("vision").notes


class _Resident(NamedTuple):
    """A forward's reading in the process's resident bytes, as ``kernel_reading.end`` gives it."""
    peak_increase: int
    retained: int = 0
    unit: str = PROCESS_RESIDENT
    level: int = 0


def test_a_warm_heap_reading_of_a_larger_shape_never_lowers_the_allowance() -> None:
    # GIVEN forwards whose resident rise was twice their tensors (a fresh heap's first touches)
    cap = capacity()
    mib = 1 << 20
    for b in (4, 6, 8):
        cap.observe({"batch": b, "seq_len": 512}, 8 * b * mib, 0, _Resident(16 * b * mib))
    assert cap.gap_ratio() == 2.0
    # WHEN forwards 5x larger are served from pages the heap kept: they rise by their tensors or less
    cap.observe({"batch": 40, "seq_len": 512}, 8 * 40 * mib, 0, _Resident(8 * 40 * mib))
    cap.observe({"batch": 36, "seq_len": 512}, 8 * 36 * mib, 0, _Resident(int(8.2 * 36 * mib)))
    # THEN the ratio stays what the fresh heap showed (the quarter floor would leave those shapes out)
    assert cap.gap_ratio() == 2.0
    p = cap.predict({"batch": 40, "seq_len": 512})
    assert p.gap_ratio == 2.0 and p.upper_bytes is not None and p.upper_bytes >= 2 * 8 * 40 * mib
    # AND a larger forward that read 1.3x (it found part of what it needed resident) lowers it neither
    cap.observe({"batch": 48, "seq_len": 512}, 8 * 48 * mib, 0, _Resident(int(10.4 * 48 * mib)))
    assert cap.gap_ratio() == 2.0
    # while a larger rise raises it
    cap.observe({"batch": 56, "seq_len": 512}, 8 * 56 * mib, 0, _Resident(int(20 * 56 * mib)))
    assert cap.gap_ratio() == 2.5


def test_where_every_shape_reads_warm_those_readings_answer() -> None:
    # GIVEN a model whose every forward rose by its tensors (blocks mapped fresh, nothing reused)
    cap = capacity()
    mib = 1 << 20
    for b in (4, 8, 16):
        cap.observe({"batch": b, "seq_len": 512}, 8 * b * mib, 0, _Resident(int(8.1 * b * mib)))
    # THEN they are the ratio, not "no reading yet"
    assert cap.gap_ratio() == round(8.1 / 8, 4)


def test_the_reuse_credit_is_the_pages_the_largest_forward_left_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    from memprof_otel.capacity import service
    mib = 1 << 20
    rss = {"now": 0}
    monkeypatch.setattr(service.registry, "process", lambda: object())
    monkeypatch.setattr(service, "resident_now", lambda: rss["now"])
    # GIVEN a small forward whose rise was 2.5x its tensors (the allowance), then the largest forward:
    # 100 MiB of tensors that raised the process from 400 to 550 MiB (1.5x, part of it found resident)
    cap = capacity()
    cap.observe({"batch": 30, "seq_len": 512}, 30 * mib, 0, _Resident(75 * mib, level=475 * mib))
    cap.observe({"batch": 100, "seq_len": 512}, 100 * mib, 0, _Resident(150 * mib, level=550 * mib))
    assert cap.gap_ratio() == 2.5
    # WHEN the process has kept 100 MiB of what that forward brought in (500 MiB resident now)
    rss["now"] = 500 * mib
    # THEN the credit is those 100 MiB: not the allowance's 250 MiB less what was released (200 MiB),
    # which counted pages the forward never had as found again (measured: a ViT's next answer was 1.34x
    # the batch it had just run, and the kernel killed it)
    assert cap.reuse_credit(2.5) == 100 * mib
    a = cap.answering("prefill", "cpu")
    assert (a.scale, a.extra) == (2.5, -100 * mib)
    # AND it is no more than what is resident above the forward's start, and never a penalty
    rss["now"] = 420 * mib
    assert cap.reuse_credit(2.5) == 20 * mib
    rss["now"] = 300 * mib
    assert cap.reuse_credit(2.5) == 0
    # AND a forward whose rise was under its allowance's share is credited its own rise at most
    assert cap.reuse_credit(1.0) <= 100 * mib
