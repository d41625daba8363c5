"""The advice rules: each fires on a crafted measurement, stays silent on a healthy one, and cites
the figures it was given. Allocator figures come from the functions the sources publish them with
(``cuda_stats.figures`` over the scripted CUDA allocator double, ``glibc.figures_from_mallinfo``)."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from memprof_otel.advice import (RULE_IDS, SEVERITIES, Advice, CapacityFacts, Evidence, Figure, LeakSuspect,
                                 ModelLayers, advise, build_report, severity_rank)
from memprof_otel.advice import rules
from memprof_otel.sources import cuda_stats
from memprof_otel.units import format_bytes
from memprof_otel.sources.glibc import figures_from_mallinfo
from memprof_otel.units import format_bytes
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble

REPO = Path(__file__).resolve().parents[3]
GIB = 1024 * MIB


# ---- measurements ---------------------------------------------------------------------------

def fragmented_cuda() -> tuple[ScriptedCudaAllocatorDouble, dict[str, float]]:
    """The scripted CUDA allocator double after mixed 6/2 MiB blocks with every 6 MiB one freed
    (600 MiB stranded in split segments) and two 512 MiB tensors freed (1 GiB of whole free segments)."""
    dev = ScriptedCudaAllocatorDouble(0)
    blocks = [dev.malloc((6 if i % 2 == 0 else 2) * MIB) for i in range(200)]
    for h in blocks[::2]:
        dev.free(h)
    for h in [dev.malloc(512 * MIB) for _ in range(2)]:
        dev.free(h)
    return dev, cuda_stats.figures(dev.memory_stats_nested(0))


def healthy_cuda() -> dict[str, float]:
    """A busy, tidy device: 3 GiB of live tensors in their own segments, nothing cached."""
    dev = ScriptedCudaAllocatorDouble(0)
    for _ in range(6):
        dev.malloc(512 * MIB)
    dev.free(dev.malloc(4 * MIB))  # a little churn: one small free block in a 20 MiB segment
    return cuda_stats.figures(dev.memory_stats_nested(0))


def glibc(free: int, heap: int, keepcost: int = 0) -> dict[str, float]:
    """mallinfo2 of a heap of ``heap`` bytes in arenas with ``free`` of them free."""
    return figures_from_mallinfo({"arena": heap, "ordblks": 10, "smblks": 0, "hblks": 0, "hblkhd": 0,
                                  "usmblks": 0, "fsmblks": 0, "uordblks": heap - free, "fordblks": free,
                                  "keepcost": keepcost})


def layers(model: str = "m", **peaks: int) -> ModelLayers:
    return ModelLayers(model, "cpu", {k.replace("__", "."): v for k, v in peaks.items()})


def roomy(model: str = "m", device: str = "cuda:0") -> CapacityFacts:
    return CapacityFacts(model, device, "device total", usable_bytes=80 * GIB, in_use_bytes=20 * GIB,
                         predicted_peak_bytes=10 * GIB, headroom_bytes=60 * GIB, max_safe_batch={512: 64, 2048: 16})


def healthy() -> Evidence:
    return Evidence(sampled=True, allocators={"cuda:0": healthy_cuda(), "cpu": glibc(10 * MIB, 400 * MIB)},
                    models=[ModelLayers("m", "cuda:0", {"": 200 * MIB, "enc": 80 * MIB, "dec": 90 * MIB,
                                                        "enc.attn": 70 * MIB})],
                    instrumented=["m"], leak_watch=True, capacity=[roomy()])


def by_id(advice: list[Advice], id_: str) -> list[Advice]:
    return [a for a in advice if a.id == id_]


def values(a: Advice) -> dict[str, float]:
    return {k: f.value for k, f in a.figures.items()}


# ---- healthy: every rule silent ---------------------------------------------------------------

def test_a_healthy_process_gets_no_advice():
    ev = healthy()
    assert advise(ev) == []
    report = build_report(ev)
    assert report.advice == () and report.notes == ()  # everything checked, nothing to say
    assert report.to_dict()["checked"]["devices"] == ["cpu", "cuda:0"]


# ---- CUDA ---------------------------------------------------------------------------------

def test_cuda_fragmentation_fires_with_the_devices_numbers():
    _, f = fragmented_cuda()
    (a,) = by_id(advise(Evidence(sampled=True, allocators={"cuda:0": f})), "cuda-fragmentation")
    assert values(a) == {"inactive_split_bytes": 600 * MIB, "reserved_bytes": f["reserved_bytes"],
                         "fragmentation_ratio": f["fragmentation_ratio"]}
    assert a.severity == "warning" and a.context == {"device": "cuda:0"}
    assert "expandable_segments:True" in a.action and "PYTORCH_CUDA_ALLOC_CONF" in a.action
    assert "600.0 MiB" in a.title and "cuda:0" in a.title


def test_cuda_fragmentation_thresholds():
    base = {"reserved_bytes": 1000 * MIB, "allocated_bytes": 600 * MIB, "active_bytes": 600 * MIB}

    def fired(split: float) -> list[Advice]:
        f = {**base, "inactive_split_bytes": split, "fragmentation_ratio": split / base["reserved_bytes"]}
        return by_id(advise(Evidence(sampled=True, allocators={"cuda:1": f})), "cuda-fragmentation")

    assert fired(249 * MIB) == []                          # under a quarter of reserved
    assert fired(250 * MIB)[0].severity == "warning"
    assert fired(500 * MIB)[0].severity == "critical"      # half of it stranded
    small = {"reserved_bytes": 200 * MIB, "inactive_split_bytes": 127 * MIB, "fragmentation_ratio": 0.635}
    assert by_id(advise(Evidence(sampled=True, allocators={"cuda:0": small})), "cuda-fragmentation") == []
    # glibc figures have the same keys: device cpu never gets the CUDA advice
    cpu = {**base, "inactive_split_bytes": 600 * MIB, "fragmentation_ratio": 0.6}
    assert by_id(advise(Evidence(sampled=True, allocators={"cpu": cpu})), "cuda-fragmentation") == []


def test_cache_slack_says_what_empty_cache_would_return_and_it_does():
    dev, f = fragmented_cuda()
    (a,) = by_id(advise(Evidence(sampled=True, allocators={"cuda:0": f})), "cache-slack")
    releasable = a.figures["releasable_bytes"].value
    assert releasable == 1024 * MIB and a.severity == "info"
    # it cites the allocator cache (the memory breakdown's allocator_cache): all that is reserved, free
    cache = a.figures["allocator_cache_bytes"].value
    assert cache == f["reserved_bytes"] - f["allocated_bytes"] >= releasable
    assert a.title.startswith(f"the allocator cache on cuda:0 holds {format_bytes(cache)} free")
    assert "empty_cache()" in a.action and "1.0 GiB" in a.action
    assert "inside a request" in a.action and "cudaMalloc" in a.action
    # what the advice says empty_cache() would return is what it returns
    dev.empty_cache()
    after = cuda_stats.figures(dev.memory_stats_nested(0))
    assert f["reserved_bytes"] - after["reserved_bytes"] == releasable
    assert by_id(advise(Evidence(sampled=True, allocators={"cuda:0": after})), "cache-slack") == []


def test_alloc_retries_and_ooms_from_the_double_name_counts_and_remedies():
    dev = ScriptedCudaAllocatorDouble(0, capacity_bytes=1 * GIB)
    dev.free(dev.malloc(600 * MIB))  # cached, then in the way: the next request must retry
    dev.malloc(700 * MIB)            # retry: the cache is freed and the request fits
    with pytest.raises(Exception):   # no cache left to free: an OOM
        dev.malloc(700 * MIB)
    f = cuda_stats.figures(dev.memory_stats_nested(0))
    assert f["alloc_retries"] >= 1 and f["ooms"] == 1
    ev = Evidence(sampled=True, allocators={"cuda:0": f}, capacity=[roomy(device="cuda:0")])
    retry, oom = by_id(advise(ev), "alloc-retries")[0], by_id(advise(ev), "oom")[0]
    assert retry.severity == "warning" and retry.figures["alloc_retries"].value == f["alloc_retries"]
    assert oom.severity == "critical" and oom.figures["ooms"].value == 1
    for a in (retry, oom):
        assert a.action.index("expandable_segments") < a.action.index("seq_len 512: batch 64")
    assert "empty_cache() is not a remedy" in retry.action


def test_ooms_seen_in_forwards_count_on_cpu_without_cuda_remedies():
    ev = Evidence(sampled=True, allocators={"cpu": glibc(0, 100 * MIB)}, extra_ooms={"cpu": 2})
    (a,) = advise(ev)
    assert (a.id, a.severity, a.figures["ooms"].value, a.context) == ("oom", "critical", 2, {"device": "cpu"})
    assert "expandable_segments" not in a.action and "smaller batches" in a.action
    assert by_id(advise(Evidence(extra_ooms={"cuda:0": 0})), "oom") == []


# ---- glibc --------------------------------------------------------------------------------

def test_glibc_arena_free_fires_on_free_bytes_held_in_arenas():
    f = glibc(free=700 * MIB, heap=1 * GIB, keepcost=100 * MIB)
    (a,) = advise(Evidence(sampled=True, allocators={"cpu": f}))
    assert a.id == "glibc-arena-free" and a.context == {"device": "cpu"}
    assert values(a) == {"free_bytes": 700 * MIB, "reserved_bytes": GIB, "allocated_bytes": 324 * MIB,
                         "cache_free_ratio": f["cache_free_ratio"], "free_below_top_bytes": 600 * MIB}
    for remedy in ("MALLOC_ARENA_MAX=2", "malloc_trim(0)", "LD_PRELOAD", "jemalloc"):
        assert remedy in a.action


@pytest.mark.parametrize("free,heap", [(255 * MIB, 300 * MIB), (300 * MIB, 1100 * MIB)])
def test_glibc_arena_free_stays_silent_under_either_threshold(free: int, heap: int):
    assert advise(Evidence(sampled=True, allocators={"cpu": glibc(free, heap)})) == []


# ---- layers -------------------------------------------------------------------------------

def test_the_deepest_dominating_layer_is_named_with_its_share():
    m = ModelLayers("llm", "cuda:0", {"": 100 * MIB, "blocks": 95 * MIB, "blocks.0": 90 * MIB,
                                      "blocks.0.self_attn": 60 * MIB, "blocks.0.self_attn.proj": 20 * MIB,
                                      "blocks.0.mlp": 55 * MIB, "head": 10 * MIB})
    (a,) = advise(Evidence(models=[m]))
    assert a.id == "layer-transient-peak" and a.severity == "info"
    assert a.context == {"model": "llm", "layer": "blocks.0.self_attn", "device": "cuda:0"}
    assert values(a) == {"layer_peak_increase_bytes": 60 * MIB, "forward_peak_increase_bytes": 100 * MIB,
                         "share": 0.6}
    assert "scaled_dot_product_attention" in a.action and "60%" in a.title


def test_a_non_attention_layer_gets_chunking_and_80_percent_is_a_warning():
    (a,) = advise(Evidence(models=[layers(**{"": 100 * MIB, "encoder": 85 * MIB, "head": 5 * MIB})]))
    assert a.context["layer"] == "encoder" and a.severity == "warning"
    assert "Chunk" in a.action and "attention" not in a.action


@pytest.mark.parametrize("peaks", [
    {"": 100 * MIB, "a": 49 * MIB, "b": 49 * MIB},       # no layer holds half
    {"": 31 * MIB, "a": 30 * MIB},                        # too small to be worth a change
    {"": 0, "a": 0},                                      # nothing measured
    {"a": 100 * MIB},                                     # no root figure to compare with
])
def test_layer_rule_stays_silent_without_a_dominating_large_transient(peaks: dict[str, int]):
    assert advise(Evidence(models=[ModelLayers("m", "cpu", peaks)])) == []


# ---- leaks --------------------------------------------------------------------------------

def test_a_layer_leak_suspect_names_the_layer_its_rate_and_what_to_check():
    s = LeakSuspect("layer", "llm", "blocks.3.cache", "cuda:0", slope_bytes_per_second=2 * MIB,
                    growth_bytes=240 * MIB, window_seconds=120.0, last_bytes=300 * MIB)
    (a,) = advise(Evidence(leak_watch=True, leak_suspects=[s]))
    assert a.id == "leak-suspect" and a.severity == "warning"
    assert a.context == {"source": "layer", "model": "llm", "layer": "blocks.3.cache", "device": "cuda:0"}
    assert values(a) == {"growth_bytes_per_second": 2 * MIB, "growth_bytes": 240 * MIB, "window_seconds": 120.0,
                         "last_bytes": 300 * MIB}
    assert "2.0 MiB/s" in a.title and "blocks.3.cache" in a.title and "inference_mode" in a.action


def test_a_process_leak_suspect_points_at_the_heap_diff():
    s = LeakSuspect("process", "", "", "", 1e6, 6e7, 60.0, None)
    (a,) = advise(Evidence(leak_watch=True, leak_suspects=[s]))
    assert a.context == {"source": "process"} and "memprof-otel heap" in a.action
    assert "last_bytes" not in a.figures


# ---- capacity -----------------------------------------------------------------------------

def test_near_limit_warns_when_the_largest_request_would_not_fit_twice():
    c = replace(roomy(), in_use_bytes=62 * GIB, headroom_bytes=8 * GIB)  # 18 GiB available, 10 needed
    (a,) = advise(Evidence(capacity=[c]))
    assert (a.id, a.severity) == ("near-limit", "warning")
    assert "8.0 GiB left after the largest recent request's peak, less than the 10.0 GiB" in a.title
    assert a.context == {"model": "m", "device": "cuda:0", "limit": "device total"}
    assert a.figures["headroom_bytes"].value == 8 * GIB and a.figures["predicted_peak_bytes"].value == 10 * GIB
    assert a.figures["max_safe_batch_seq_len_2048"] == Figure(16, "batch")
    assert "seq_len 512: batch 64, seq_len 2048: batch 16" in a.action


def test_near_limit_is_critical_over_the_limit_and_silent_with_room():
    over = replace(roomy(), in_use_bytes=81 * GIB, headroom_bytes=-11 * GIB, max_safe_batch={512: 0, 2048: 0})
    (a,) = advise(Evidence(capacity=[over]))
    assert a.severity == "critical" and "1.0 GiB over the usable limit" in a.title
    assert advise(Evidence(capacity=[replace(roomy(), headroom_bytes=10 * GIB)])) == []  # fits exactly twice


def cuda_facts(**kw: int) -> CapacityFacts:
    """A 1 GiB device of which other processes hold 100 MiB and a 5 % margin is kept (the limit's
    parts as the budget has them), with a request of 300 MiB at its peak (200 MiB predicted)."""
    limit, held, margin = 1024 * MIB, 100 * MIB, int(1024 * MIB * 0.05)
    usable = limit - held - margin
    in_use = kw.pop("in_use", 200 * MIB)
    request = kw.pop("request", 300 * MIB)
    table = kw.pop("table", {64: 3, 512: 0})
    return CapacityFacts("gpt2", "cuda:0", "cuda_device", usable, in_use, 200 * MIB, usable - in_use - request,
                         table, limit_bytes=limit, held_elsewhere_bytes=held, margin_bytes=margin)


def test_critical_near_limit_when_in_use_is_over_the_usable_limit_says_so_and_what_helps():
    c = cuda_facts(in_use=1000 * MIB, table={64: 0, 512: 0})
    (a,) = advise(Evidence(capacity=[c]))
    usable = 1024 * MIB - 100 * MIB - int(1024 * MIB * 0.05)
    assert a.severity == "critical"
    # the figures are the budget's parts, and they add up
    v = values(a)
    assert v["usable_bytes"] == usable == v["limit_bytes"] - v["held_elsewhere_bytes"] - v["margin_bytes"]
    assert v["available_bytes"] == usable - 1000 * MIB < 0
    assert v["request_bytes"] == 300 * MIB and v["headroom_bytes"] == v["available_bytes"] - v["request_bytes"]
    # what is true, with the figures
    assert "even one request of the largest recent size does not fit" in a.title
    assert (f"in use ({format_bytes(1000 * MIB)}) is already {format_bytes(1000 * MIB - usable)} over the "
            f"usable limit ({format_bytes(usable)}, cuda_device)") in a.title
    # what to do: never a batch of 0; free memory (naming where it is), raise the limit
    assert "batch 0" not in a.action and "Keep batches" not in a.action
    assert f"{format_bytes(-v['headroom_bytes'])} must be freed or added" in a.action
    assert "100.0 MiB" in a.action and "other processes" in a.action  # held elsewhere on the device
    assert "a device with more memory" in a.action and "No request fits" in a.action


def test_critical_near_limit_with_room_for_smaller_requests_names_those_that_fit():
    c = cuda_facts(in_use=700 * MIB)  # 73.2 MiB available, the request needs 300 MiB
    (a,) = advise(Evidence(capacity=[c]))
    assert a.severity == "critical" and a.figures["available_bytes"].value > 0
    assert f"it needs up to {format_bytes(300 * MIB)} at its peak and " \
           f"{format_bytes(a.figures['available_bytes'].value)} is available" in a.title
    assert "seq_len 64: batch 3" in a.action and "at seq_len 512 not even one does" in a.action
    assert "batch 0" not in a.action
    assert a.figures["max_safe_batch_seq_len_512"] == Figure(0, "batch")  # the table's own figure stays


@pytest.mark.parametrize("limit, where", [("cgroup", "the kernel will not reclaim"), ("physical", "machine's memory"),
                                          ("configured", "process's resident memory")])
def test_critical_near_limit_on_cpu_names_what_counts_against_its_limit(limit: str, where: str):
    c = CapacityFacts("m", "cpu", limit, 700 * MIB, 750 * MIB, 100 * MIB, -200 * MIB, {16: 0},
                      limit_bytes=736 * MIB, margin_bytes=36 * MIB)
    (a,) = advise(Evidence(capacity=[c]))
    assert a.severity == "critical" and where in a.action and "batch 0" not in a.action
    assert "36.0 MiB" in a.action  # the margin kept free is said


def test_oom_advice_never_asks_for_batch_0():
    c = cuda_facts(in_use=1000 * MIB, table={64: 0, 512: 0})
    (a,) = by_id(advise(Evidence(extra_ooms={"cuda:0": 1}, capacity=[c])), "oom")
    assert "batch 0" not in a.action and "Send smaller batches" in a.action
    c = cuda_facts(in_use=700 * MIB)
    (a,) = by_id(advise(Evidence(extra_ooms={"cuda:0": 1}, capacity=[c])), "oom")
    assert "(seq_len 64: batch 3)" in a.action


def test_advised_layer_is_the_layer_the_layer_rule_names():
    peaks = {"": 100 * MIB, "h": 90 * MIB, "h.0": 80 * MIB, "h.0.mlp": 60 * MIB, "h.0.mlp.act": 30 * MIB}
    (a,) = by_id(advise(Evidence(models=[ModelLayers("m", "cpu", peaks)])), "layer-transient-peak")
    assert rules.advised_layer(peaks) == a.context["layer"] == "h.0.mlp"
    assert rules.advised_layer({"": 31 * MIB, "a": 30 * MIB}) is None  # the rule is silent: nothing named


# ---- ordering, ids, documents --------------------------------------------------------------

def test_severities_are_ordered_and_advice_comes_most_severe_first():
    assert [severity_rank(s) for s in SEVERITIES] == [0, 1, 2]
    with pytest.raises(ValueError, match="severity"):
        severity_rank("fatal")
    _, frag = fragmented_cuda()
    ev = Evidence(sampled=True, allocators={"cuda:0": frag}, extra_ooms={"cuda:0": 1},
                  models=[layers(**{"": 100 * MIB, "x": 60 * MIB})])
    got = advise(ev)
    assert [a.severity for a in got] == sorted((a.severity for a in got), key=severity_rank, reverse=True)
    assert [a.id for a in got] == ["oom", "cuda-fragmentation", "cache-slack", "layer-transient-peak"]
    assert [a.id for a in build_report(ev, min_severity="warning").advice] == ["oom", "cuda-fragmentation"]
    with pytest.raises(ValueError):
        build_report(ev, min_severity="loud")


def test_every_id_has_its_docs_section_and_the_document_shape_is_stable():
    text = (REPO / "docs" / "advice.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## ([a-z-]+)$", text, re.M))
    assert sections == set(RULE_IDS)
    a = Advice("cache-slack", "info", "t", "src", {"x_bytes": Figure(3.0, "bytes")}, "do", {"device": "cuda:0"})
    assert a.to_dict() == {"id": "cache-slack", "severity": "info", "title": "t",
                           "evidence": {"source": "src", "device": "cuda:0",
                                        "figures": {"x_bytes": {"value": 3, "unit": "bytes"}}},
                           "action": "do", "docs": "docs/advice.md#cache-slack"}
    assert not a.docs.startswith("/") and a.docs.split("#")[1] in sections


def test_advice_without_a_measurement_cannot_exist():
    with pytest.raises(ValueError, match="cites no measurement"):
        Advice("oom", "critical", "t", "src", {}, "do")
    with pytest.raises(ValueError):
        Figure(1.0, "furlongs")
    with pytest.raises(ValueError):
        Advice("oom", "severe", "t", "src", {"n": Figure(1, "count")}, "do")


def test_notes_say_what_was_not_measured():
    notes = build_report(Evidence()).notes
    assert len(notes) == 4
    assert any("no sample yet" in n for n in notes) and any("no instrumented model" in n for n in notes)
    assert any("leak watch" in n for n in notes) and any("capacity" in n for n in notes)
    ev = Evidence(sampled=True, allocators={"cpu": glibc(0, MIB)}, instrumented=["idle"], leak_watch=True)
    notes = build_report(ev).notes
    assert any("CUDA" in n for n in notes) and any("'idle' has no attributed forward" in n for n in notes)
    assert not any("glibc" in n for n in notes)


def test_model_scope_keeps_that_model_its_device_and_the_process():
    _, frag = fragmented_cuda()
    ev = Evidence(sampled=True, allocators={"cuda:0": frag, "cuda:1": frag},
                  models=[ModelLayers("a", "cuda:0", {"": 100 * MIB, "x": 90 * MIB}),
                          ModelLayers("b", "cuda:1", {"": 100 * MIB, "y": 90 * MIB})],
                  leak_watch=True, leak_suspects=[LeakSuspect("process", "", "", "", 1e6, 6e7, 60.0, 1e9)])
    every = {(a.id, a.context.get("model"), a.context.get("device")) for a in advise(ev)}
    assert ("layer-transient-peak", "b", "cuda:1") in every and ("cache-slack", None, "cuda:1") in every
    scoped = {(a.id, a.context.get("model"), a.context.get("device"))
              for a in build_report(ev, model="a", model_device="cuda:0").advice}
    assert scoped == {("layer-transient-peak", "a", "cuda:0"), ("cuda-fragmentation", None, "cuda:0"),
                      ("cache-slack", None, "cuda:0"), ("leak-suspect", None, None)}


def test_thresholds_are_module_constants_with_a_reason():
    source = (REPO / "memprof_otel" / "advice" / "rules.py").read_text(encoding="utf-8").splitlines()
    for name in ("FRAGMENTATION_MIN_RATIO", "FRAGMENTATION_MIN_BYTES", "CACHE_SLACK_MIN_BYTES",
                 "GLIBC_FREE_MIN_BYTES", "LAYER_SHARE_MIN", "LAYER_PEAK_MIN_BYTES"):
        assert hasattr(rules, name)
        line = next(i for i, s in enumerate(source) if s.startswith(f"{name} ="))
        assert source[line - 1].startswith("#"), name  # the reason sits just above the value
