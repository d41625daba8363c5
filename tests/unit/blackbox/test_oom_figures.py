"""A post-mortem's cause from the record alone: what was held is the resident memory at the last
tick before the forward in flight began, the request's rise the C heap's growth since, memory
outside the allocator the resident memory outside the heap; a GPU forward's prediction is left out;
only an OOM kill claims a memory cause."""
from __future__ import annotations

import jsonschema

from memprof_otel.blackbox.oom_figures import cause_of, oom_figures
from memprof_otel.blackbox.format import Contents, Layout
from memprof_otel.blackbox.service import postmortem
from memprof_otel.cli.postmortem import render
from memprof_otel.http.openapi import openapi_document

MIB = 1 << 20
LIMIT = 700 * MIB


def tick(t: float, rss: int, heap: int | None) -> dict:
    s = {"t": t, "process": {"resident_memory_bytes": rss}, "allocators": {}}
    if heap is not None:
        s["allocators"]["cpu"] = {"allocated_bytes": heap}
    return s


def contents(samples: list[dict], flight: list[dict]) -> Contents:
    return Contents(Layout(8), {"pid": 7, "payload_version": 2}, {}, flight, samples)


FLIGHT = {"model": "m", "features": {"batch": 3, "seq_len": 37}, "layer": "blocks.1", "started_unix": 10.5,
          "limit_reached": True, "device": "cpu", "unit": "process_resident", "predicted_peak_bytes": 2 * MIB,
          "max_safe_batch": 90}


def test_a_request_that_grew_in_the_heap_until_the_kill():
    samples = [tick(10.0, 200 * MIB, 80 * MIB), tick(11.0, 400 * MIB, 280 * MIB), tick(12.0, 690 * MIB, 565 * MIB)]
    f = oom_figures(contents(samples, [FLIGHT]), LIMIT)
    assert f.static_bytes == 200 * MIB                 # the tick at 10.0: the last before 10.5
    assert f.request_rise_bytes == 565 * MIB - 80 * MIB
    assert f.outside_baseline_bytes == 120 * MIB and f.outside_bytes == 125 * MIB
    assert (f.predicted_peak_bytes, f.max_safe_batch) == (2 * MIB, 90)
    c = cause_of(contents(samples, [FLIGHT]), "oom_kill", LIMIT)
    assert c.cause == "request_too_big" and "depends on its data" in c.knob


def test_memory_outside_the_heap_that_grew_until_the_kill():
    samples = [tick(10.0, 200 * MIB, 80 * MIB), tick(12.0, 690 * MIB, 100 * MIB)]
    c = cause_of(contents(samples, [FLIGHT]), "oom_kill", LIMIT)
    assert c.figures.outside_growth_bytes == (690 - 100) * MIB - (200 - 80) * MIB
    assert c.cause == "outside_allocator"


def test_a_gpu_forwards_prediction_is_not_the_hosts_and_other_ends_claim_no_cause():
    gpu = {**FLIGHT, "device": "cuda:0", "unit": "cuda_reserved", "predicted_peak_bytes": 10 * LIMIT}
    samples = [tick(10.0, 200 * MIB, 80 * MIB), tick(12.0, 690 * MIB, 565 * MIB)]
    f = oom_figures(contents(samples, [gpu]), LIMIT)
    assert f.predicted_peak_bytes is None and f.max_safe_batch is None
    c = cause_of(contents(samples, [FLIGHT]), "killed", LIMIT)
    assert c.cause == "unknown" and "no memory cause is claimed" in c.summary


def test_an_old_record_without_heap_figures_says_what_is_missing():
    old = {k: v for k, v in FLIGHT.items() if k not in ("device", "unit", "predicted_peak_bytes", "max_safe_batch")}
    c = cause_of(contents([tick(10.0, 200 * MIB, None), tick(12.0, 690 * MIB, None)], [old]), "oom_kill", LIMIT)
    assert c.cause == "unknown"
    assert {"predicted_peak_bytes", "request_rise_bytes", "outside_bytes"} <= set(c.missing)


def test_the_post_mortem_document_and_the_cli_text_carry_the_cause():
    samples = [tick(10.0, 200 * MIB, 80 * MIB), tick(12.0, 690 * MIB, 565 * MIB)]
    for s in samples:
        s["limit_bytes"] = LIMIT
    doc = postmortem(contents(samples, [FLIGHT]), "oom_kill", ["limit_reached"])
    assert doc["cause"]["cause"] == "request_too_big" and doc["limit_bytes"] == LIMIT
    assert doc["in_flight"][0]["predicted_peak_bytes"] == 2 * MIB and doc["in_flight"][0]["max_safe_batch"] == 90
    # the document is what the published schema says
    spec = openapi_document()
    jsonschema.Draft202012Validator({**spec["components"]["schemas"]["Postmortems"],
                                     "components": spec["components"]}).validate(
        {"postmortems": [doc], "skipped_files": {}, "scanning": False, "recording": True})
    text = render({"postmortems": [doc]})
    assert "  cause: request_too_big: the request (batch=3 seq_len=37) rose" in text
    assert f"  knob: {doc['cause']['knob']}" in text


def test_a_leak_the_detector_suspected_that_took_the_room():
    # the process grew over minutes before the forward began: what was held already has the leak
    leak = {"source": "process", "model": "", "layer": "", "device": "", "slope_bytes_per_second": 500_000.0,
            "growth_bytes": 300.0 * MIB, "window_seconds": 600.0}
    samples = [tick(10.0, 560 * MIB, 300 * MIB), {**tick(12.0, 690 * MIB, 330 * MIB), "leak": leak}]
    c = cause_of(contents(samples, [FLIGHT]), "oom_kill", LIMIT)
    room = LIMIT - 560 * MIB
    assert c.figures.room_bytes == room and c.figures.leak.growth_bytes == 300 * MIB >= room / 2
    assert c.figures.request_rise_bytes == 30 * MIB and c.figures.outside_growth_bytes == 100 * MIB
    assert c.cause == "leak" and "the process's resident memory" in c.summary
    # a damaged suspect is left out, never a crash
    samples[-1]["leak"] = {"source": "process"}
    assert cause_of(contents(samples, [FLIGHT]), "oom_kill", LIMIT).figures.leak is None


def test_a_tick_whose_two_readings_straddled_an_allocation_does_not_move_the_cgroup_figure():
    # GIVEN back-to-back forwards (every tick busy) in a cgroup that charges 100 MiB of this
    # process's resident file pages elsewhere, and a last tick before the start whose working set
    # was read 60 MiB of allocation after its resident size (two sources, two threads)
    def busy(t: float, rss: int, ws: int) -> dict:
        return {**tick(t, rss, None), "busy": 1, "container": {"memory_working_set_bytes": ws}}

    samples = [busy(5.0 + 0.5 * i, (300 + 7 * i) * MIB, (200 + 7 * i) * MIB) for i in range(10)]
    samples.append(busy(10.4, 380 * MIB, 340 * MIB))  # gap -40 MiB: skewed
    flight = {**FLIGHT, "start_resident_bytes": 390 * MIB}
    f = oom_figures(contents(samples, [flight]), LIMIT)
    # THEN what the limit counted when the forward began is its resident size less the 100 MiB
    # charged elsewhere (the gap of the ticks before it), not less the skewed tick's 40
    assert f.static_bytes == 290 * MIB
