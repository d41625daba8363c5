"""The rules: each reads the evidence and answers the advice it calls for, citing the figures.

A rule never guesses: when a figure it needs is absent it stays silent. Thresholds are module
constants, each with the reason for its value. ``advise`` runs every rule and orders the answer
most severe first.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from ..units import format_bytes
from .evidence import CapacityFacts, Evidence, LeakSuspect, ModelLayers, OomCauseFacts
from .items import Advice, Figure, severity_rank

MIB = 1024 * 1024
GIB = 1024 * MIB

# cuda-fragmentation. The caching allocator always strands a little memory in split blocks (the
# small pool carves 2 MiB segments, 1-10 MiB requests share 20 MiB segments), typically a few
# percent of reserved. A quarter of reserved is past that churn: requests that need a contiguous
# block of that size start to miss and the allocator cudaMallocs more instead.
FRAGMENTATION_MIN_RATIO = 0.25
# Half of what the process holds from the device unusable for large requests: an OOM with
# "reserved but unallocated" memory is then likely, not merely possible.
FRAGMENTATION_CRITICAL_RATIO = 0.5
# Below this the stranded bytes are a few large-pool segments: not worth changing allocator
# settings for, whatever the ratio (a small process is 50 % fragmented by a single split segment).
FRAGMENTATION_MIN_BYTES = 128 * MIB

# cache-slack. Caching freed segments is the allocator's design (the next request reuses them
# without a cudaMalloc); it only matters when the cached part is large in absolute terms (another
# process on the GPU could use it) and a large part of what the process holds (else it is simply
# the working set's own churn).
CACHE_SLACK_MIN_BYTES = 512 * MIB
CACHE_SLACK_MIN_RATIO = 0.3

# glibc-arena-free. glibc keeps freed chunks in its arenas (per thread, up to 8 x cores of them)
# and counts them in RSS: the container's limit sees them. Below 256 MiB this is the normal
# working set of a Python process's heap; above 30 % of the heap free it is memory a trim or
# fewer arenas would give back.
GLIBC_FREE_MIN_BYTES = 256 * MIB
GLIBC_FREE_MIN_RATIO = 0.3

# layer-transient-peak. A layer holding at least half the forward's transient is the majority of
# it: chunking that one layer in two cuts the forward's peak increase by a quarter or more. The
# root's ancestors always contain a dominating layer's peak, so they dominate too; the deepest
# layer at or above the share is the most specific place to change.
LAYER_SHARE_MIN = 0.5
# With 80 % in one layer, nearly the whole transient is in one place: a warning, not a hint.
LAYER_SHARE_WARNING = 0.8
# Transients under 32 MiB are below what restructuring a layer is worth: the CUDA allocator alone
# rounds large requests to 2 MiB and carves 1-10 MiB ones from 20 MiB segments.
LAYER_PEAK_MIN_BYTES = 32 * MIB

ATTENTION_MARKERS = ("attn", "attention")


def _pct(r: float) -> str:
    return f"{r:.0%}"


def _cuda_devices(ev: Evidence) -> list[tuple[str, Mapping[str, float]]]:
    return [(d, f) for d, f in sorted(ev.allocators.items()) if d.startswith("cuda")]


def _capacity_for(ev: Evidence, device: str) -> list[CapacityFacts]:
    return [c for c in ev.capacity if c.device == device]


def _safe_batches(facts: Sequence[CapacityFacts]) -> str:
    """"seq_len 512: batch 8, seq_len 2048: batch 2" over the capacity facts given, or "". Rows
    where not even one request fits (batch 0) are left out: no one can keep a batch at 0; the
    callers say where nothing fits (``_nothing_fits``)."""
    parts = [f"{c.model} at seq_len {s}: batch {b}" if len(facts) > 1 else f"seq_len {s}: batch {b}"
             for c in facts for s, b in sorted(c.max_safe_batch.items()) if b > 0]
    return ", ".join(parts)


def _nothing_fits(c: CapacityFacts) -> list[int]:
    """The sequence lengths of the table at which not even a batch of one fits."""
    return [s for s, b in sorted(c.max_safe_batch.items()) if b <= 0]


# ---- CUDA allocator ---------------------------------------------------------------------------

def cuda_fragmentation(ev: Evidence) -> Iterable[Advice]:
    for device, f in _cuda_devices(ev):
        split, reserved = f.get("inactive_split_bytes"), f.get("reserved_bytes")
        if split is None or not reserved:
            continue
        ratio = f.get("fragmentation_ratio", split / reserved)
        if split < FRAGMENTATION_MIN_BYTES or ratio < FRAGMENTATION_MIN_RATIO:
            continue
        yield Advice(
            id="cuda-fragmentation",
            severity="critical" if ratio >= FRAGMENTATION_CRITICAL_RATIO else "warning",
            title=f"{format_bytes(split)} of the {format_bytes(reserved)} reserved on {device} is stranded "
                  f"in split blocks ({_pct(ratio)})",
            source="CUDA caching allocator (torch.cuda.memory_stats)",
            context={"device": device},
            figures={"inactive_split_bytes": Figure(split, "bytes"), "reserved_bytes": Figure(reserved, "bytes"),
                     "fragmentation_ratio": Figure(ratio, "ratio")},
            action="Start the process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments then "
                   "grow in place instead of being split, so freed blocks can serve requests of any size. "
                   "If requests vary widely in shape, padding them to a few fixed sizes also helps.")


def cache_slack(ev: Evidence) -> Iterable[Advice]:
    for device, f in _cuda_devices(ev):
        reserved, allocated = f.get("reserved_bytes"), f.get("allocated_bytes")
        if not reserved or allocated is None:
            continue
        active = f.get("active_bytes", allocated)
        split = f.get("inactive_split_bytes", 0.0)
        # empty_cache() frees the segments with no block in use; split ones keep their live blocks
        releasable = max(0.0, reserved - active - split)
        share = releasable / reserved
        if releasable < CACHE_SLACK_MIN_BYTES or share < CACHE_SLACK_MIN_RATIO:
            continue
        cache = max(0.0, reserved - allocated)  # the memory breakdown's allocator_cache component
        yield Advice(
            id="cache-slack", severity="info",
            title=f"the allocator cache on {device} holds {format_bytes(cache)} free: "
                  f"{format_bytes(releasable)} of it in free cached segments "
                  f"({_pct(share)} of {format_bytes(reserved)} reserved; {format_bytes(allocated)} allocated)",
            source="CUDA caching allocator (torch.cuda.memory_stats)",
            context={"device": device},
            figures={"releasable_bytes": Figure(releasable, "bytes"), "allocator_cache_bytes": Figure(cache, "bytes"),
                     "reserved_bytes": Figure(reserved, "bytes"),
                     "allocated_bytes": Figure(allocated, "bytes"), "active_bytes": Figure(active, "bytes"),
                     "inactive_split_bytes": Figure(split, "bytes")},
            action=f"torch.cuda.empty_cache() between requests (or after a rare large one) would return about "
                   f"{format_bytes(releasable)} to the device, for other processes on the GPU. Never call it "
                   "inside a request: it synchronizes the device and frees segments with cudaFree, and the next "
                   "request re-reserves them with cudaMalloc. If no other process needs the GPU, leave the "
                   "cache alone.")


def alloc_retries_and_ooms(ev: Evidence) -> Iterable[Advice]:
    devices = sorted(set(ev.allocators) | set(ev.extra_ooms))
    for device in devices:
        f = ev.allocators.get(device, {})
        cuda = device.startswith("cuda")
        retries = f.get("alloc_retries", 0.0) if cuda else 0.0
        ooms = f.get("ooms", 0.0) + ev.extra_ooms.get(device, 0)
        batches = _safe_batches(_capacity_for(ev, device))
        smaller = (f"Keep batches at or under the largest safe batch ({batches})." if batches else
                   "Send smaller batches (or shorter sequences) to this device.")
        expandable = ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so fragmented free space can "
                      "serve large requests. " if cuda else "")
        if ooms > 0:
            yield Advice(
                id="oom", severity="critical",
                title=f"{int(ooms)} out-of-memory error{'s' if ooms != 1 else ''} on {device}",
                source="CUDA caching allocator (num_ooms) and OOMs seen in forwards" if cuda
                else "OOMs seen in instrumented forwards",
                context={"device": device},
                figures={"ooms": Figure(ooms, "count"),
                         **({"alloc_retries": Figure(retries, "count")} if cuda else {})},
                action=f"{expandable}{smaller} The OOM dump (GET /v1/dumps, kind oom) shows the layer and "
                       "the memory at the failure.")
        if retries > 0:
            yield Advice(
                id="alloc-retries", severity="warning",
                title=f"{int(retries)} allocation retr{'ies' if retries != 1 else 'y'} on {device}: the allocator "
                      "ran out of cached memory and freed its whole cache to retry",
                source="CUDA caching allocator (num_alloc_retries)",
                context={"device": device},
                figures={"alloc_retries": Figure(retries, "count"),
                         **({"reserved_bytes": Figure(f["reserved_bytes"], "bytes")} if "reserved_bytes" in f else {})},
                action=f"{expandable}{smaller} torch.cuda.empty_cache() is not a remedy: a retry already "
                       "empties the cache, and each one synchronizes the device and slows the request.")


# ---- glibc host heap ----------------------------------------------------------------------------

def glibc_arena_free(ev: Evidence) -> Iterable[Advice]:
    f = ev.allocators.get("cpu")
    if not f or "cache_free_ratio" not in f or "reserved_bytes" not in f or "allocated_bytes" not in f:
        return
    reserved, allocated = f["reserved_bytes"], f["allocated_bytes"]
    free = max(0.0, reserved - allocated)  # mallinfo2 fordblks: arena - uordblks
    ratio = f["cache_free_ratio"]
    if free < GLIBC_FREE_MIN_BYTES or ratio < GLIBC_FREE_MIN_RATIO:
        return
    gaps = f.get("inactive_split_bytes", 0.0)  # free chunks below the top chunk
    yield Advice(
        id="glibc-arena-free", severity="warning",
        title=f"glibc's arenas hold {format_bytes(free)} of freed memory ({_pct(ratio)} of the "
              f"{format_bytes(reserved)} heap), counted in RSS",
        source="glibc malloc (mallinfo2)",
        context={"device": "cpu"},
        figures={"free_bytes": Figure(free, "bytes"), "reserved_bytes": Figure(reserved, "bytes"),
                 "allocated_bytes": Figure(allocated, "bytes"), "cache_free_ratio": Figure(ratio, "ratio"),
                 "free_below_top_bytes": Figure(gaps, "bytes")},
        action="Start the process with MALLOC_ARENA_MAX=2 (fewer per-thread arenas keep less free memory); "
               "call malloc_trim(0) after large requests (ctypes.CDLL('libc.so.6').malloc_trim(0)) to give "
               "free pages back; or run on jemalloc or tcmalloc (LD_PRELOAD), which return memory on their own.")


# ---- layers ------------------------------------------------------------------------------------

def _depth(path: str) -> int:
    return path.count(".") + 1


def _dominant_layer(m: ModelLayers) -> tuple[str, int, float] | None:
    root = m.peak_increase.get("", 0)
    if root <= 0:
        return None
    best: tuple[int, float, str] | None = None
    for path, inc in m.peak_increase.items():
        share = inc / root
        if path == "" or share < LAYER_SHARE_MIN:
            continue
        key = (_depth(path), share, path)
        if best is None or key[:2] > best[:2] or (key[:2] == best[:2] and path < best[2]):
            best = key
    return None if best is None else (best[2], m.peak_increase[best[2]], best[1])


def _named_layer(m: ModelLayers) -> tuple[str, int, float] | None:
    """The layer layer-transient-peak names for ``m`` (path, its peak increase, its share), or None."""
    found = _dominant_layer(m)
    return found if found is not None and m.peak_increase.get("", 0) >= LAYER_PEAK_MIN_BYTES else None


def advised_layer(peak_increase: Mapping[str, int]) -> str | None:
    """The layer layer-transient-peak would name over these figures (layer path -> peak increase,
    ``""`` the root), or None: what the series budget exports whatever its rank."""
    found = _named_layer(ModelLayers("", "", peak_increase))
    return found[0] if found is not None else None


def layer_transient_peak(ev: Evidence) -> Iterable[Advice]:
    for m in ev.models:
        found = _named_layer(m)
        if found is None:
            continue
        root = m.peak_increase.get("", 0)
        layer, inc, share = found
        attention = any(k in layer.lower() for k in ATTENTION_MARKERS)
        what = ("Use a memory-efficient attention (torch.nn.functional.scaled_dot_product_attention, which "
                "picks the flash or memory-efficient kernel; attn_implementation='sdpa' or "
                "'flash_attention_2' in transformers) instead of materializing the attention matrix, or "
                "process the sequence in chunks." if attention else
                "Chunk the layer's work (split the batch or the sequence and concatenate the results) or "
                "stream it, so its temporaries exist for one chunk at a time.")
        yield Advice(
            id="layer-transient-peak",
            severity="warning" if share >= LAYER_SHARE_WARNING else "info",
            title=f"layer {layer!r} of {m.model} makes {_pct(share)} of the forward's transient peak "
                  f"({format_bytes(inc)} of {format_bytes(root)})",
            source="per-layer attribution (exported window figures, memprof_layer_peak_increase_bytes)",
            context={"model": m.model, "layer": layer, "device": m.device},
            figures={"layer_peak_increase_bytes": Figure(inc, "bytes"),
                     "forward_peak_increase_bytes": Figure(root, "bytes"), "share": Figure(share, "ratio")},
            action=f"{what} The forward's peak falls by up to what the layer's transient shrinks.")


# ---- leaks -------------------------------------------------------------------------------------

def _leak_check(s: LeakSuspect) -> str:
    if s.source == "layer":
        return ("Check what keeps this layer's outputs alive between requests: caches that grow per request "
                "(a KV cache, a list appended to), tensors stored on the module, and outputs kept with their "
                "autograd graph (run inference under torch.inference_mode(), .detach() what you keep).")
    if s.source == "allocator" and s.device.startswith("cuda"):
        return ("Check for tensors kept across requests on this device (caches, lists, globals); an OOM dump or "
                "memprof-otel dump shows which layers hold them.")
    return ("Check Python objects kept across requests: memprof-otel heap --url URL --seconds 60 lists the "
            "allocation sites whose live memory grows.")


def leak_suspect(ev: Evidence) -> Iterable[Advice]:
    for s in ev.leak_suspects:
        if s.source == "layer":
            where, context = f"layer {s.layer!r} of {s.model} ({s.device})", {
                "model": s.model, "layer": s.layer, "device": s.device}
        elif s.source == "allocator":
            where, context = f"the {s.device} allocator", {"device": s.device}
        else:
            where, context = "the process RSS", {}
        figures = {"growth_bytes_per_second": Figure(s.slope_bytes_per_second, "bytes_per_second"),
                   "growth_bytes": Figure(s.growth_bytes, "bytes"),
                   "window_seconds": Figure(s.window_seconds, "seconds")}
        if s.last_bytes is not None:
            figures["last_bytes"] = Figure(s.last_bytes, "bytes")
        yield Advice(
            id="leak-suspect", severity="warning",
            title=f"{where} grows {format_bytes(s.slope_bytes_per_second)}/s "
                  f"({format_bytes(s.growth_bytes)} over {s.window_seconds:.0f} s)",
            source=f"leak watch ({s.source} series, GET /v1/leaks)",
            context={"source": s.source, **context},
            figures=figures, action=_leak_check(s))


# ---- capacity ----------------------------------------------------------------------------------

# what raises each limit (the budget's ``limit``), for the critical near-limit action
_RAISE = {"cuda_device": "a device with more memory", "mig": "a larger MIG slice",
          "memory_fraction": "a larger torch.cuda.set_per_process_memory_fraction()",
          "hami": "a larger HAMi quota (CUDA_DEVICE_MEMORY_LIMIT)",
          "cgroup": "a larger container memory limit", "physical": "a machine with more memory",
          "configured": "a larger capacity.limit_bytes, if the real limit allows it"}


def _held(c: CapacityFacts) -> str:
    """Where the memory in use is, as the budget counts it on this device and limit."""
    if c.device.startswith("cuda"):
        text = (f"this process's live tensors hold {format_bytes(c.in_use_bytes)} on {c.device} (other models, "
                "KV caches, tensors kept between requests)")
        if c.held_elsewhere_bytes > 0:
            text += (f", and other processes and CUDA contexts {format_bytes(c.held_elsewhere_bytes)} "
                     "(move them to another device)")
        return text
    return {"cgroup": f"the container holds {format_bytes(c.in_use_bytes)} the kernel will not reclaim (every "
                      "process of the cgroup counts; its page cache only as far as code needs it)",
            "physical": f"{format_bytes(c.in_use_bytes)} of the machine's memory is in use (every process on "
                        "it counts)",
            "configured": f"the process's resident memory is {format_bytes(c.in_use_bytes)} (models, caches, "
                          "objects kept between requests, freed heap not given back)",
            }.get(c.limit, f"{format_bytes(c.in_use_bytes)} is in use")


def _critical(c: CapacityFacts) -> tuple[str, str]:
    """(title, action) when even one request of the largest recent size does not fit."""
    short = -c.headroom_bytes  # what must be freed (or added) for one such request to fit
    head = f"{c.model} on {c.device}: even one request of the largest recent size does not fit"
    if c.available_bytes <= 0:
        title = (f"{head}: in use ({format_bytes(c.in_use_bytes)}) is already "
                 f"{format_bytes(-c.available_bytes)} over the usable limit ({format_bytes(c.usable_bytes)}, "
                 f"{c.limit})")
    else:
        title = (f"{head}: it needs up to {format_bytes(c.request_bytes)} at its peak and "
                 f"{format_bytes(c.available_bytes)} is available ({format_bytes(c.usable_bytes)} usable, "
                 f"{format_bytes(c.in_use_bytes)} in use; {c.limit})")
    steps = [f"{format_bytes(short)} must be freed or added before one request of this size fits. "
             f"Free memory: {_held(c)}.",
             f"Or raise the limit: {_RAISE.get(c.limit, 'a larger limit')}."]
    if c.margin_bytes > 0:
        steps.append(f"The usable limit already keeps a margin of {format_bytes(c.margin_bytes)} free "
                     "(capacity.margin_ratio, capacity.margin_bytes).")
    batches, none = _safe_batches([c]), _nothing_fits(c)
    if batches:
        steps.append(f"Smaller requests fit now: {batches}"
                     + (f"; at seq_len {', '.join(map(str, none))} not even one does" if none else "") + ".")
    elif c.available_bytes > 0:
        steps.append("Smaller requests (fewer rows, shorter sequences) may fit: "
                     f"{format_bytes(c.available_bytes)} is available.")
    else:
        steps.append("No request fits while in use is over the usable limit, however small: free memory "
                     "or raise the limit first.")
    return title, " ".join(steps)


def near_limit(ev: Evidence) -> Iterable[Advice]:
    for c in ev.capacity:
        if c.headroom_bytes >= c.predicted_peak_bytes and c.headroom_bytes >= 0:
            continue
        figures = {"usable_bytes": Figure(c.usable_bytes, "bytes"), "in_use_bytes": Figure(c.in_use_bytes, "bytes"),
                   "available_bytes": Figure(c.available_bytes, "bytes"),
                   "predicted_peak_bytes": Figure(c.predicted_peak_bytes, "bytes"),
                   "request_bytes": Figure(c.request_bytes, "bytes"),
                   "headroom_bytes": Figure(c.headroom_bytes, "bytes"),
                   **({"limit_bytes": Figure(c.limit_bytes, "bytes"),
                       "held_elsewhere_bytes": Figure(c.held_elsewhere_bytes, "bytes"),
                       "margin_bytes": Figure(c.margin_bytes, "bytes")} if c.limit_bytes > 0 else {}),
                   **{f"max_safe_batch_seq_len_{s}": Figure(b, "batch")
                      for s, b in sorted(c.max_safe_batch.items())}}
        context = {"model": c.model, "device": c.device, "limit": c.limit}
        if c.headroom_bytes < 0:
            title, action = _critical(c)
            yield Advice(id="near-limit", severity="critical", title=title, source=f"capacity model ({c.limit})",
                         context=context, figures=figures, action=action)
            continue
        batches = _safe_batches([c])
        yield Advice(
            id="near-limit", severity="warning",
            title=(f"{c.model} on {c.device}: {format_bytes(c.headroom_bytes)} left after the largest recent "
                   f"request's peak, less than the {format_bytes(c.request_bytes)} one more would need"),
            source=f"capacity model ({c.limit})", context=context, figures=figures,
            action=(f"Keep batches at or under the largest safe batch ({batches}); " if batches else
                    "Send smaller batches; ")
                   + "two requests of the largest recent size at once would not fit. Raise the limit, or "
                     "serve fewer concurrent requests on this device.")


# ---- the last out-of-memory ---------------------------------------------------------------------

_CAUSE_WORDS = {"request_too_big": "a request too big for the limit", "fragmentation": "fragmentation",
                "outside_allocator": "memory outside the allocator", "leak": "a leak",
                "static_over_limit": "static memory over the limit", "unknown": "no cause the figures show"}


def oom_cause(ev: Evidence) -> Iterable[Advice]:
    c: OomCauseFacts | None = ev.oom_cause
    if c is None or c.cause == "unknown":
        return  # an unknown cause has no knob to give: the oom advice and the record say what is known
    figures = {k: Figure(v, "bytes") for k, v in sorted(c.figures.items())}
    if c.max_safe_batch is not None:
        figures["max_safe_batch"] = Figure(c.max_safe_batch, "batch")
    if not figures:
        return
    where = ("the process the kernel OOM-killed" if c.source == "postmortem" else f"{c.model} on {c.device}")
    yield Advice(
        id="oom-cause", severity="critical",
        title=f"the last out-of-memory ({where}) was {_CAUSE_WORDS.get(c.cause, c.cause)}: {c.summary}",
        source="OOM record (GET /v1/dumps, kind oom)" if c.source == "oom" else "post-mortem (GET /v1/postmortem)",
        context={"cause": c.cause, "model": c.model, "device": c.device,
                 **({"dump_id": c.dump_id} if c.dump_id else {})},
        figures=figures, action=c.knob[:1].upper() + c.knob[1:] + ".")


Rule = Callable[[Evidence], Iterable[Advice]]
RULES: tuple[Rule, ...] = (cuda_fragmentation, cache_slack, alloc_retries_and_ooms, glibc_arena_free,
                           layer_transient_peak, leak_suspect, near_limit, oom_cause)
# every id an advice can have (alloc_retries_and_ooms answers two): the docs have one section each
RULE_IDS: tuple[str, ...] = ("cuda-fragmentation", "cache-slack", "glibc-arena-free", "layer-transient-peak",
                             "near-limit", "leak-suspect", "alloc-retries", "oom", "oom-cause")


def advise(ev: Evidence) -> list[Advice]:
    """Every rule over ``ev``; most severe first, then by id and what it is about."""
    out = [a for rule in RULES for a in rule(ev)]
    return sorted(out, key=lambda a: (-severity_rank(a.severity), a.id, sorted(a.context.items())))
