"""Leak detection on real models: surviving bytes per layer checked against the arithmetic of the
tensors the test keeps, and growth detection on the figures real forwards leave behind.

The detector is fed one reading per forward on a synthetic clock (10 ms a forward), so "a leak of
1 MiB per 100 forwards" is a rate the test controls, whatever this machine's speed. Healthy
controls (GPT-2 ``generate()`` with its KV cache, repeated; an allocator cache that fills once)
must not be flagged.
"""
from __future__ import annotations

import gc
import math
import threading
from typing import Any

import httpx
import jsonschema
import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.config import LeaksConfig
from memprof_otel.sources.process import ProcessSource
from memprof_otel.telemetry.leaks import LAYER, PROCESS, LeakWatch, WatchKey
from memprof_otel.timeline import Sample

from .support.helpers import JSON_HEADERS
from .support.models import F32

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
MiB = 1 << 20
DT = 0.01  # synthetic seconds per forward
# one floor per 100 forwards, a 30-floor window, 200 forwards of warm-up; thresholds are the defaults
FAST = LeaksConfig(floor_interval=1.0, trend_window=30.0, warmup=2.0)
LEAK_FLOATS = 2621  # 10,484 bytes a forward: 1 MiB per 100 forwards


class Hoard(nn.Module):
    """Keeps a fresh tensor of ``n`` floats on every call: the staircase of a leak."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept.append(torch.zeros(self.n))
        return x * 2


class Leaky(nn.Module):
    def __init__(self, n: int = LEAK_FLOATS) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.hoard = Hoard(n)
        self.post = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.hoard(self.pre(x)))


class GraphKeeper(nn.Module):
    """Keeps a scalar of every forward *with its autograd graph*: ``z * z`` saves ``z`` (born in
    ``lin``) for the backward that never comes, so each forward leaves ``z`` alive."""

    def __init__(self, batch: int = 16, width: int = 256) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.lin(x)
        y = z * z
        self.kept.append(y.sum())
        return y


class WithKeeper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.keeper = GraphKeeper()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.keeper(x)


def _watch(cfg: LeaksConfig, handles: list[mp.Instrumentation], with_rss: bool = False) -> Any:
    """A LeakWatch over the handles' real surviving bytes (and the real RSS), on the test's clock."""
    def surviving() -> dict[tuple[str, str, str], int]:
        return {(h.name, layer, dev): n for h in handles for (layer, dev), n in h.surviving().items()}

    watch = LeakWatch(cfg, surviving)
    proc = ProcessSource() if with_rss else None

    def tick(i: int) -> None:
        process = {"resident_memory_bytes": float(proc.reading().allocated)} if proc is not None else {}
        watch.on_sample(Sample(t=1_000.0 + i * DT, process=process))
    return watch, tick


def _suspects(watch: LeakWatch) -> set[WatchKey]:
    return {k for k, tr in watch.trends().items() if tr.suspected}


# ---- surviving bytes against arithmetic -------------------------------------------------------

def test_surviving_bytes_every_forward_are_the_bytes_kept_in_the_layer_that_made_them():
    model = Leaky(n=1000)
    h = mp.instrument(model, name="leaky", **EVERY)
    x = torch.randn(4, 8)
    for _ in range(7):
        out = model(x)
    s = h.surviving()
    act = 4 * 8 * F32
    # seven kept tensors of 1000 floats, and hoard's output x * 2, which post's addmm saved for a
    # backward: the graph of the output the test still holds keeps it alive
    assert s[("hoard", "cpu")] == 7 * 1000 * F32 + act
    assert s[("post", "cpu")] == act                      # the output the test still holds
    assert s.get(("pre", "cpu"), 0) == 0                  # x * 2 saves nothing: freed in the forward
    assert h.layer_stats()["hoard"].surviving_bytes == 7 * 1000 * F32 + act
    del out
    assert h.surviving()[("post", "cpu")] == 0
    assert h.surviving()[("hoard", "cpu")] == 7 * 1000 * F32
    model.hoard.kept.clear()
    assert h.surviving()[("hoard", "cpu")] == 0


def test_surviving_bytes_count_attributed_forwards_only():
    # every third forward attributed (1st, 4th, 7th, ...): a sample of what every forward leaves
    model = Leaky(n=1000)
    h = mp.instrument(model, name="leaky", every_n_forwards=3, overhead_budget=1.0)
    x = torch.randn(4, 8)
    for _ in range(10):
        model(x)
    assert len(model.hoard.kept) == 10
    assert h.surviving()[("hoard", "cpu")] == math.ceil(10 / 3) * 1000 * F32
    # the kept tensors of forwards that were not attributed are not counted, whoever frees them
    del model.hoard.kept[1:3]
    assert h.surviving()[("hoard", "cpu")] == 4 * 1000 * F32
    del model.hoard.kept[0]
    assert h.surviving()[("hoard", "cpu")] == 3 * 1000 * F32


def test_surviving_bytes_under_the_default_overhead_budget():
    model = Leaky(n=1000)
    h = mp.instrument(model, name="leaky")  # the default scheduler: a budget, not every forward
    x = torch.randn(4, 8)
    for _ in range(200):
        model(x)
    attributed = h.scheduler.state().attributed
    assert 1 <= attributed < 200
    # exactly one kept tensor per attributed forward, none of the others
    assert h.surviving()[("hoard", "cpu")] == attributed * 1000 * F32


def test_a_tensor_kept_with_its_autograd_graph_survives_in_the_layer_that_made_what_it_saved():
    model = WithKeeper()
    h = mp.instrument(model, name="graph", **EVERY)
    x = torch.randn(16, 256)
    for _ in range(5):
        model(x)
    z_bytes = 16 * 256 * F32  # z = lin(x), saved twice by z * z (one storage)
    s = h.surviving()
    assert s[("keeper.lin", "cpu")] == 5 * z_bytes
    assert s[("keeper", "cpu")] == 5 * F32  # the kept scalars themselves
    model.keeper.kept.clear()
    gc.collect()
    assert h.surviving()[("keeper.lin", "cpu")] == 0
    # without a graph (no_grad) nothing of lin's survives: the kept scalars only
    with torch.no_grad():
        for _ in range(5):
            model(x)
    s = h.surviving()
    assert s[("keeper.lin", "cpu")] == 0 and s[("keeper", "cpu")] == 5 * F32


def test_survivors_freed_in_another_thread_leave_the_figure():
    model = Leaky(n=1000)
    h = mp.instrument(model, name="leaky", **EVERY)
    for _ in range(4):
        model(torch.randn(4, 8))
    kept = model.hoard.kept
    model.hoard.kept = []
    t = threading.Thread(target=kept.clear)
    t.start()
    t.join()
    assert h.surviving()[("hoard", "cpu")] == 0


def test_survivors_are_bounded_by_max_tracked_storages():
    model = Leaky(n=100)
    h = mp.instrument(model, name="leaky", leaks={"max_tracked_storages": 3}, **EVERY)
    for _ in range(6):
        model(torch.randn(4, 8))
    assert h.survivors is not None
    counts = h.survivors.counts()
    assert counts["held"] == 3 and counts["capacity"] == 3
    assert counts["untracked_storages"] >= 3  # the figure is a lower bound from here on
    assert counts["untracked_bytes"] >= 3 * 100 * F32
    assert h.surviving()[("hoard", "cpu")] <= 3 * 100 * F32


def test_surviving_off_tracks_nothing():
    model = Leaky(n=100)
    h = mp.instrument(model, name="leaky", leaks={"surviving": False}, **EVERY)
    model(torch.randn(4, 8))
    assert h.surviving() == {} and h.layer_stats()["hoard"].surviving_bytes == 0


# ---- growth detection on real forwards ----------------------------------------------------------

def test_leak_of_1mib_per_100_forwards_is_flagged_in_its_layer_within_a_few_thousand_forwards():
    model = Leaky()
    h = mp.instrument(model, name="leaky", **EVERY)
    watch, tick = _watch(FAST, [h])
    x = torch.randn(4, 8)
    flagged_at = None
    for i in range(4000):
        model(x)
        tick(i)
        if flagged_at is None and _suspects(watch):
            flagged_at = i
            break
    assert flagged_at is not None, "a 1 MiB per 100 forwards leak was not flagged in 4000 forwards"
    assert _suspects(watch) == {WatchKey(LAYER, "leaky", "hoard", "cpu")}
    tr = watch.trends()[WatchKey(LAYER, "leaky", "hoard", "cpu")]
    # the slope is the leak's rate on the test's clock: 10,484 bytes per 10 ms
    assert tr.slope == pytest.approx(LEAK_FLOATS * F32 / DT, rel=0.02)
    # and the figure it was fitted on is the arithmetic of what the list holds
    assert h.surviving()[("hoard", "cpu")] == len(model.hoard.kept) * LEAK_FLOATS * F32
    series = watch.series()
    flags = {tuple(sorted(lab.items())): v for lab, v in series["memprof_layer_leak_suspected"]}
    assert flags[(("device", "cpu"), ("layer", "hoard"), ("model", "leaky"))] == 1.0
    assert all(v == 0.0 for k, v in flags.items() if ("layer", "hoard") not in k)


def test_under_sampled_attribution_the_leak_is_flagged_with_the_sampled_fraction_of_its_rate():
    # every fourth forward attributed: surviving bytes grow by a quarter of the leak, so the window
    # must be long enough for a quarter of the leak to pass min_growth_bytes (16 MiB)
    model = Leaky()
    h = mp.instrument(model, name="leaky", every_n_forwards=4, overhead_budget=1.0)
    watch, tick = _watch(LeaksConfig(floor_interval=1.0, trend_window=90.0, warmup=2.0), [h])
    x = torch.randn(4, 8)
    for i in range(12_000):
        model(x)
        tick(i)
        if _suspects(watch):
            break
    assert _suspects(watch) == {WatchKey(LAYER, "leaky", "hoard", "cpu")}
    tr = watch.trends()[WatchKey(LAYER, "leaky", "hoard", "cpu")]
    assert tr.slope == pytest.approx(LEAK_FLOATS * F32 / DT / 4, rel=0.05)
    assert h.surviving()[("hoard", "cpu")] == math.ceil(len(model.hoard.kept) / 4) * LEAK_FLOATS * F32


def test_tensor_kept_with_its_graph_is_flagged():
    model = WithKeeper()
    h = mp.instrument(model, name="graph", **EVERY)
    watch, tick = _watch(FAST, [h])
    x = torch.randn(16, 256)
    for i in range(3000):
        model(x)
        tick(i)
        if _suspects(watch):
            break
    assert WatchKey(LAYER, "graph", "keeper.lin", "cpu") in _suspects(watch)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=128, n_positions=256, n_embd=64, n_layer=2, n_head=2,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.timeout(300)
def test_gpt2_generate_with_kv_cache_repeated_is_not_flagged():
    # the KV cache is born in the attention layers on every step and dropped when generate()
    # returns: surviving bytes rise through each request and fall back, a sawtooth with flat floors
    torch.manual_seed(0)
    model = _gpt2()
    h = mp.instrument(model, name="gpt2", **EVERY)
    # one floor per 3 requests of 16 tokens, 2 requests of warm-up
    cfg = LeaksConfig(floor_interval=48 * DT, trend_window=30 * 48 * DT, warmup=32 * DT)
    watch, tick = _watch(cfg, [h], with_rss=True)
    levels: list[int] = []

    def after_forward(*_: Any) -> None:  # runs after our root hook: the level as a sampler sees it
        levels.append(sum(h.surviving().values()))
        tick(len(levels))
    model.register_forward_hook(after_forward)
    ids = torch.randint(3, 128, (1, 8))
    mask = torch.ones_like(ids)
    for _ in range(45):  # 720 forwards
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                           use_cache=True, pad_token_id=0, eos_token_id=2)
    assert h.scheduler.state().forwards == len(levels) == 720
    # the sawtooth was seen: each request ends far above where the next one starts (its 8-token prefill)
    assert levels[15] > 2 * levels[16] and levels[-1] > 2 * levels[-16]
    trends = watch.trends()
    assert any(k.source == LAYER for k in trends), "no layer was watched: the control tests nothing"
    assert WatchKey(PROCESS, "", "", "") in trends
    assert _suspects(watch) == set(), {k: t for k, t in trends.items() if t.suspected}
    # after generate() returns, nothing of its forwards is alive but its last logits, if that
    assert sum(h.surviving().values()) < levels[16]


def test_allocator_cache_that_fills_once_is_not_flagged():
    # warm-up and lazy init: a buffer registered on first use, 4 MiB at once, then flat
    class LazyCache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cache: torch.Tensor | None = None
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.cache is None:
                self.cache = torch.zeros(MiB)  # 4 MiB, born in the root on the first forward
            return self.lin(x)

    model = LazyCache()
    h = mp.instrument(model, name="lazy", **EVERY)
    watch, tick = _watch(FAST, [h])
    x = torch.randn(4, 8)
    for i in range(2500):
        model(x)
        tick(i)
    assert h.surviving()[("", "cpu")] == MiB * F32
    assert _suspects(watch) == set()


# ---- the endpoint ---------------------------------------------------------------------------

def test_v1_leaks_answers_suspects_trends_and_top_layers(tmp_path):
    mp.start_monitoring({"sampler": {"interval": "20ms"}, "dumps": {"dir": str(tmp_path)},
                         "leaks": {"floor_interval": "50ms", "trend_window": "1s", "warmup": "0s",
                                   "min_growth_bytes": "1MiB"}})
    srv = mp.serve(port=0)
    model = Leaky(n=64 * 1024)  # 256 KiB a forward
    mp.instrument(model, name="leaky", **EVERY)
    x = torch.randn(4, 8)
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c:
        openapi = c.get("/openapi.json").json()
        doc: dict[str, Any] = {}
        for _ in range(600):
            model(x)
            threading.Event().wait(0.01)
            doc = c.get("/v1/leaks", params={"top": 2}).json()
            if any(s["layer"] == "hoard" for s in doc["suspects"]):
                break
        jsonschema.validate(doc, _resolvable(openapi))
        assert [s["layer"] for s in doc["suspects"] if s["source"] == "layer"] == ["hoard"]
        hoard = next(s for s in doc["suspects"] if s["layer"] == "hoard")
        tr = hoard["trend"]
        assert tr["suspected"] and tr["slope_low"] > 0 and tr["window_seconds"] > 0
        assert tr["window_end_unix"] - tr["window_start_unix"] == pytest.approx(tr["window_seconds"])
        top = doc["top_surviving_layers"]
        assert len(top) == 2 and top[0]["layer"] == "hoard"
        assert top[0]["surviving_bytes"] == len(model.hoard.kept) * 64 * 1024 * F32
        assert doc["survivor_tables"]["leaky"]["untracked_storages"] == 0
        assert doc["survivor_tables"]["leaky"]["capacity"] == 20_000
        assert c.get("/v1/leaks", params={"top": "0"}).status_code == 400
        assert c.get("/v1/leaks", params={"top": "x"}).json()["error"] == "bad_parameter"
        # and the scrape carries the same flag
        text = c.get("/metrics").text
        assert 'memprof_layer_leak_suspected{device="cpu",layer="hoard",model="leaky"} 1.0' in text
        assert "memprof_layer_growth_bytes_per_second{" in text
        assert 'memprof_layer_surviving_bytes{device="cpu",layer="hoard",model="leaky"}' in text
    srv.close()


def _resolvable(openapi: dict[str, Any]) -> dict[str, Any]:
    """The Leaks schema at the root of the OpenAPI document, so its #/components/schemas/... refs
    resolve."""
    return {**openapi, **openapi["components"]["schemas"]["Leaks"]}
