"""The ``oom-cause`` advice: the last OOM's cause, its byte figures and safe batch cited, its knob as
the action; an unknown cause gives none (it has no knob)."""
from __future__ import annotations

from memprof_otel.advice import Evidence, OomCauseFacts, advise
from memprof_otel.oom.cause import OomFigures, classify

MIB = 1 << 20


def facts_of(figures: OomFigures, source: str = "oom") -> OomCauseFacts:
    c = classify(figures).to_dict()
    f = c["figures"]
    return OomCauseFacts(c["cause"], c["summary"], c["knob"], source, "m", figures.device, 1.0,
                         {k: float(v) for k, v in f.items() if k.endswith("_bytes")}, f.get("max_safe_batch"),
                         "20990101T000000Z-1-oom")


def test_the_last_cause_is_advice_with_its_knob():
    figures = OomFigures("cuda:0", limit_bytes=512 * MIB, static_bytes=0, predicted_peak_bytes=900 * MIB,
                         features={"batch": 75, "seq_len": 128}, max_safe_batch=24)
    [a] = [a for a in advise(Evidence(oom_cause=facts_of(figures))) if a.id == "oom-cause"]
    assert a.severity == "critical" and a.context["cause"] == "request_too_big"
    assert a.action.startswith("Lower the batch to 24")
    d = a.to_dict()["evidence"]
    assert d["figures"]["max_safe_batch"] == {"value": 24, "unit": "batch"}
    assert d["figures"]["room_bytes"]["value"] == 512 * MIB and d["dump_id"] == "20990101T000000Z-1-oom"


def test_an_unknown_cause_gives_no_advice():
    assert [a for a in advise(Evidence(oom_cause=facts_of(OomFigures("cpu")))) if a.id == "oom-cause"] == []
    assert [a for a in advise(Evidence()) if a.id == "oom-cause"] == []
