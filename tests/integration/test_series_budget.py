"""The series budget on a real model over real HTTP: in top mode /metrics carries the per-layer
series of the root and the top layers only, /v1/layers still every layer, and the process says how
many series it exported; OpenTelemetry's layer histogram follows the same choice."""
from __future__ import annotations

import httpx
import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

import memprof_otel as mp
from tests.integration.support.helpers import wait_until
from tests.integration.support.models import TINY_VOCAB, tiny_gpt2

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
LAYER_FAMILIES = ("memprof_layer_peak_increase_bytes", "memprof_layer_peak_allocated_bytes",
                  "memprof_layer_retained_bytes", "memprof_layer_forward_seconds_count",
                  "memprof_layer_forward_seconds_sum")


def _parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Exposition text -> sample name -> (labels, value), with a parser that is not ours."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _parent(path: str, tracked: object) -> str:
    q = path
    while "." in q:
        q = q.rsplit(".", 1)[0]
        if q in tracked:  # type: ignore[operator]
            return q
    return ""


def _children(stats: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {p: [] for p in stats}
    for p in stats:
        if p:
            out[_parent(p, stats)].append(p)
    return out


def _explained(stats: dict, path: str, kids: list[str]) -> bool:
    """A container: its peak is at most its largest child's plus what all its children kept."""
    return bool(kids) and stats[path].peak_increase <= (max(stats[k].peak_increase for k in kids)
                                                        + sum(max(0, stats[k].retained) for k in kids))


def _passed_over(stats: dict) -> set[str]:
    """The containers as docs/reference.md states them: explained by their children, or with
    children and exactly their parent's figure where the parent is not explained itself."""
    kids = _children(stats)
    explained = {p for p in stats if p and _explained(stats, p, kids[p])}
    same = {p for p in stats if p and kids[p] and _parent(p, stats) not in explained
            and stats[p].peak_increase == stats[_parent(p, stats)].peak_increase}
    return explained | same


def _expected_top(stats: dict, k: int) -> set[str]:
    """What top mode exports, from the handle's own table and the rule docs/reference.md states:
    the root and the k highest peaks among the layers doing the work (ties: the deeper, then path
    order)."""
    skip = _passed_over(stats)
    working = [p for p in stats if p and p not in skip]
    ranked = sorted(working, key=lambda p: (-stats[p].peak_increase, -p.count("."), p))
    return {"", *ranked[:k]}


def _serve_gpt2(series: dict) -> tuple:
    torch.manual_seed(0)
    m = tiny_gpt2()
    mp.start_monitoring({"sampler": {"interval": "100ms"}, "series": series})
    h = mp.instrument(m, name="gpt2", attribution=EVERY)
    with torch.no_grad():
        for _ in range(2):
            m(torch.randint(0, TINY_VOCAB, (2, 16)))
    return m, h, mp.serve(port=0)


@pytest.mark.timeout(120)
def test_top_mode_exports_the_root_and_the_top_layers_and_counts_what_it_exported() -> None:
    m, h, srv = _serve_gpt2({"layers": "top", "top_layers": 3})
    try:
        stats = h.layer_stats()
        # the reference: the three highest all-time peaks of the layers doing the work
        expected = _expected_top(stats, 3)
        first = httpx.get(srv.url + "/metrics").text
        fams = _parse(first)
        for name in LAYER_FAMILIES:
            assert {lab["layer"] for lab, _ in fams[name]} == expected, name
        assert [(lab["model"], v) for lab, v in fams["memprof_layers_tracked"]] == [("gpt2", len(stats))]
        assert [(lab["model"], v) for lab, v in fams["memprof_layers_exported"]] == [("gpt2", 4)]
        assert fams["memprof_series_budget"][0][1] == 1000
        # every layer is still one step away
        layers = httpx.get(srv.url + "/v1/layers").json()["models"]["gpt2"]["layers"]
        assert set(layers) == set(stats) and len(stats) > 20
        # the second scrape says how many samples the first one had (counted by the parser here)
        samples_first = sum(len(rows) for rows in fams.values())
        second = _parse(httpx.get(srv.url + "/metrics").text)
        assert second["memprof_series_exported"][0][1] == samples_first
        assert samples_first < 120  # the root and 3 layers: about a tenth of every layer's series
        # /v1/status says what was chosen, and why
        st = httpx.get(srv.url + "/v1/status").json()["series"]
        assert st["layers"] == "top" and st["every_layer"] is False and st["budget"] == 1000
        assert st["exported_layers"] == {"gpt2": sorted(expected)}
        assert st["series_exported"] == sum(len(rows) for rows in second.values())
    finally:
        srv.close()
        h.uninstrument()
        mp.shutdown(2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("series, every", [({"layers": "all"}, True), ({"layers": "auto"}, True),
                                           ({"layers": "top", "full_detail_fraction": 1.0}, True),
                                           ({"layers": "auto", "_pod": True}, False)])
def test_which_processes_export_every_layer(series: dict, every: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if series.pop("_pod", False):
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # auto in a Kubernetes pod: top
    m, h, srv = _serve_gpt2(series)
    try:
        fams = _parse(httpx.get(srv.url + "/metrics").text)
        exported = {lab["layer"] for lab, _ in fams["memprof_layer_peak_increase_bytes"]}
        assert (exported == set(h.layer_stats())) is every
        assert len(exported) == (len(h.layer_stats()) if every else 5)  # top_layers 4 and the root
    finally:
        srv.close()
        h.uninstrument()
        mp.shutdown(2)


@pytest.mark.timeout(120)
def test_the_otel_layer_histogram_and_gauges_follow_the_same_choice() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    torch.manual_seed(0)
    m = tiny_gpt2()
    try:
        mp.start_monitoring({"sampler": {"interval": "50ms"}, "series": {"layers": "top", "top_layers": 2}},
                            meter_provider=meters)
        h = mp.instrument(m, name="gpt2", attribution=EVERY)
        with torch.no_grad():
            for _ in range(3):
                m(torch.randint(0, TINY_VOCAB, (2, 16)))
        data = reader.get_metrics_data()
        layers: dict[str, set[str]] = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name.startswith("memprof.layer."):
                        layers.setdefault(metric.name, set()).update(
                            p.attributes["layer"] for p in metric.data.data_points)
        stats = h.layer_stats()
        # the same forward three times: the top two are the same after each one
        assert layers["memprof.layer.forward"] == _expected_top(stats, 2)
        assert layers["memprof.layer.peak_increase"] == _expected_top(stats, 2)
    finally:
        mp.shutdown(2)
        meters.shutdown()


class _Leaky(torch.nn.Module):
    """Keeps 256 KiB at every call: a small layer, far from the top by peak, that leaks."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept.append(torch.ones(64 * 1024))
        return x + 1


class _Big(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.ones(4 << 20)[:1].sum() * 0  # a 16 MiB temporary: the top layer by peak


@pytest.mark.timeout(120)
def test_a_leak_suspect_outside_the_top_layers_exports_every_per_layer_family_and_is_counted() -> None:
    m = torch.nn.Sequential()
    m.add_module("big", _Big())
    m.add_module("leaky", _Leaky())
    m.add_module("lin", torch.nn.Linear(8, 8))
    mp.start_monitoring({"sampler": {"interval": "20ms"}, "series": {"layers": "top", "top_layers": 1},
                         "leaks": {"warmup": 0, "floor_interval": "50ms", "trend_window": "3s",
                                   "min_growth_rate": 1, "min_growth_bytes": 1}})
    h = mp.instrument(m, name="m", attribution={**EVERY, "window": "1s"})
    srv = mp.serve(port=0)
    try:
        def suspected() -> bool:
            with torch.no_grad():
                m(torch.ones(8))
            leaks = httpx.get(srv.url + "/v1/leaks").json()["suspects"]
            return any(s.get("layer") == "leaky" for s in leaks)

        wait_until(suspected, timeout=60, what="the leaking layer flagged")
        stats = h.layer_stats()
        top = sorted((p for p in stats if p), key=lambda p: (-stats[p].peak_increase, p))[0]
        assert top == "big" and stats["leaky"].peak_increase < stats["big"].peak_increase
        # the choice is remade at most a second later; then every family carries the suspect. The
        # layer goes on leaking meanwhile: a suspect whose growth stopped leaves the trend window
        # after 3 s, which a loaded machine's slow ticks and scrapes reached before the choice
        def exported() -> bool:
            with torch.no_grad():
                m(torch.ones(8))
            return "leaky" in (httpx.get(srv.url + "/v1/status").json()["series"]["exported_layers"] or {}).get("m", [])

        wait_until(exported, timeout=60, what="the suspect among the exported layers")
        fams = _parse(httpx.get(srv.url + "/metrics").text)
        for name in LAYER_FAMILIES:
            assert {lab["layer"] for lab, _ in fams[name] if lab["model"] == "m"} == {"", "big", "leaky"}, name
        assert [v for lab, v in fams["memprof_layers_exported"] if lab["model"] == "m"] == [3]
        assert httpx.get(srv.url + "/v1/status").json()["series"]["exported_layers"] == {"m": ["", "big", "leaky"]}
    finally:
        srv.close()
        h.uninstrument()
        mp.shutdown(2)


def named_by_advice(url: str) -> set[str]:
    advice = httpx.get(url + "/v1/advice").json()["advice"]
    return {a["evidence"]["layer"] for a in advice if a["id"] == "layer-transient-peak"}


def gpt2_four_blocks() -> torch.nn.Module:
    """A 4-block GPT-2 built from its config, with the eager attention (it materializes the
    attention matrix, as the model's own code does without a fused kernel)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=TINY_VOCAB, n_positions=512, n_embd=64, n_layer=4, n_head=2,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.timeout(180)
def test_top_mode_keeps_the_layers_doing_the_work_and_the_layer_the_advice_names() -> None:
    torch.manual_seed(0)
    m = gpt2_four_blocks()
    mp.start_monitoring({"sampler": {"interval": "100ms"}, "series": {"layers": "top"}})  # top_layers: 4
    h = mp.instrument(m, name="gpt2", attribution=EVERY)
    with torch.no_grad():
        for _ in range(2):
            m(torch.randint(0, TINY_VOCAB, (8, 512)))  # a forward peak of tens of MiB: the advice speaks
    srv = mp.serve(port=0)
    try:
        stats = h.layer_stats()
        kids = _children(stats)
        fams = _parse(httpx.get(srv.url + "/metrics").text)
        exported = {lab["layer"] for lab, _ in fams["memprof_layer_peak_increase_bytes"]}
        # the containers of the model are there to be passed over: transformer is the root's figure
        # again, each block its children's
        assert stats["transformer"].peak_increase == stats[""].peak_increase
        for i in range(4):
            assert _explained(stats, f"transformer.h.{i}", kids[f"transformer.h.{i}"])
        assert not exported & {"transformer", *(f"transformer.h.{i}" for i in range(4))}
        # the layer with the largest own peak (its peak above its largest child's; a leaf's own is
        # its peak) is kept; equal blocks tie, any one of them will do
        own = {p: stats[p].peak_increase - max((stats[k].peak_increase for k in kids[p]), default=0)
               for p in stats if p}
        assert exported & {p for p, v in own.items() if v == max(own.values())}, sorted(own.items(), key=lambda x: -x[1])[:6]
        # no kept layer is a pure container: equal to its only child's figure or its parent's, or
        # explained by its children
        for p in exported - {""} - named_by_advice(srv.url):
            if kids[p]:
                assert not _explained(stats, p, kids[p]), p
                assert stats[p].peak_increase != stats[_parent(p, stats)].peak_increase, p
                assert not (len(kids[p]) == 1 and stats[kids[p][0]].peak_increase == stats[p].peak_increase), p
        # the layer the advice names is exported, whatever its rank
        named = named_by_advice(srv.url)
        assert named and named <= exported, (named, exported)
        assert exported == _expected_top(stats, 4) | named
        assert httpx.get(srv.url + "/v1/status").json()["series"]["exported_layers"] == {"gpt2": sorted(exported)}
    finally:
        srv.close()
        h.uninstrument()
        mp.shutdown(2)
