"""GET /v1/headroom, memprof_capacity_* in /metrics and ``memprof-otel headroom`` end to end: a real
server on port 0, real clients, a real GPT-2 (built from a config) that the memory model learns."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import jsonschema
import pytest
import torch

import memprof_otel as mp
from tests.integration.support.demo_process import REPO

from .support.helpers import error_detail, scrape_values

pytestmark = pytest.mark.timeout(180)
transformers = pytest.importorskip("transformers")

VOCAB = 4000
SHAPES = [(b, s) for b in (1, 2, 4, 8) for s in (16, 32, 64)]


def gpt2() -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture
def learned() -> Iterator[mp.Instrumentation]:
    torch.manual_seed(0)
    model = gpt2()
    h = mp.instrument(model, name="gpt2", every_n_forwards=1, overhead_budget=1.0, seq_lens=[32, 128])
    with torch.no_grad():
        for b, s in SHAPES:
            model(torch.randint(0, VOCAB, (b, s)))
    h.capacity.model.states(force=True)
    yield h


def validate(client: httpx.Client, doc: dict) -> None:
    spec = client.get("/openapi.json").json()
    jsonschema.Draft202012Validator({**spec["components"]["schemas"]["Headroom"],
                                     "components": spec["components"]}).validate(doc)



def test_before_any_data_a_200_that_says_why(client):
    r = client.get("/v1/headroom")
    assert r.status_code == 200 and r.json() == {"models": {}, "reason": "no model is instrumented in this process"}
    mp.instrument(gpt2(), name="fresh")
    r = client.get("/v1/headroom", params={"batch": 2, "seq_len": 16})
    assert r.status_code == 200, r.text
    doc = r.json()
    validate(client, doc)
    m = doc["models"]["fresh"]
    assert m["prediction"]["peak_increase_bytes"] is None
    assert m["prediction"]["reason"] == "no forward measured yet"
    assert m["fits"] is None and "headroom_bytes" not in m


def test_a_prediction_with_its_error_budget_and_verdict(client, learned):
    r = client.get("/v1/headroom", params={"model": "gpt2", "batch": 3, "seq_len": 40})
    assert r.status_code == 200, r.text
    doc = r.json()
    validate(client, doc)
    m = doc["models"]["gpt2"]
    p = learned.predict_peak(batch=3, seq_len=40)
    assert m["prediction"]["peak_increase_bytes"] == p.peak_bytes and p.peak_bytes > 0
    assert m["prediction"]["extrapolates"] is False and m["prediction"]["error_ratio"] is not None
    b = m["budget"]
    assert b["limit"] in ("physical", "cgroup") and b["usable_bytes"] == b["limit_bytes"] - b["held_elsewhere_bytes"] - b["margin_bytes"]
    assert m["fits"] is True and m["headroom_bytes"] == b["available_bytes"] - m["prediction"]["upper_bytes"]
    assert len(m["shapes"]) == len(SHAPES)
    far = client.get("/v1/headroom", params={"model": "gpt2", "batch": 64, "seq_len": 32}).json()
    assert far["models"]["gpt2"]["prediction"]["extrapolation"] == {"batch": 8.0}


def test_the_table_without_a_shape(client, learned):
    doc = client.get("/v1/headroom").json()
    validate(client, doc)
    m = doc["models"]["gpt2"]
    table = m["max_safe_batch"]
    assert set(table) == {"32", "128"}
    rows = {r["seq_len"]: r for r in m["max_safe_batch_rows"]}
    assert {str(k): r["batch"] for k, r in rows.items()} == table
    for s, r in rows.items():
        if r["batch"] is None:  # past capacity.max_extrapolation (8) times the shapes seen: not a number
            assert "not known" in r["reason"] and r["at_least"] >= 1
            # 128 is twice the longest sequence seen (64): a batch past 32 would be 8x outside
            assert r["at_least"] == (64 if s == 32 else 32)
        else:
            assert r["extrapolation_factor"] <= 8 and r["error_ratio"] is not None
    if None not in table.values():
        assert table["32"] >= table["128"] > 0  # longer sequences, fewer of them fit


def test_python_and_http_give_one_document(client, learned):
    """h.headroom() is the model's entry of GET /v1/headroom: one schema, the same fields."""
    spec = client.get("/openapi.json").json()
    for features in ({}, {"batch": 3, "seq_len": 40}):
        mine = learned.headroom(**features)
        jsonschema.Draft202012Validator({**spec["components"]["schemas"]["Headroom"],
                                         "components": spec["components"]}).validate({"models": {"gpt2": mine}})
        theirs = client.get("/v1/headroom", params={"model": "gpt2", **features}).json()["models"]["gpt2"]
        assert set(mine) == set(theirs) and mine["enabled"] is True
        if features:
            assert set(mine["prediction"]) == set(theirs["prediction"])
            p = learned.predict_peak(**features)
            assert mine["prediction"]["peak_increase_bytes"] == p.peak_increase_bytes == p.peak_bytes  # alias
            assert mine["prediction"]["data_dependent"] is p.data_dependent is p.varies


def test_a_misspelt_or_missing_feature_is_a_400_naming_it(client, learned):
    detail = error_detail(client.get("/v1/headroom", params={"model": "gpt2", "batch": 2, "seqlen": 4}),
                          400, "bad_shape")
    assert "unknown feature [seqlen]" in detail and "[batch, seq_len]" in detail
    detail = error_detail(client.get("/v1/headroom", params={"model": "gpt2", "batch": 2}), 400, "bad_shape")
    assert "missing feature [seq_len]" in detail


@pytest.mark.parametrize("params, field", [
    ({"batch": "-1", "seq_len": "4"}, "batch"), ({"batch": "2", "seq_len": "nan"}, "seq_len"),
    ({"batch": "inf"}, "batch"), ({"seq_len": "1.5"}, "seq_len"), ({"batch": str(1 << 40)}, "batch"),
    ({"not-a-name": "3"}, "not-a-name"),
])
def test_bad_shapes_are_a_400_naming_the_field(client, learned, params, field):
    detail = error_detail(client.get("/v1/headroom", params={"model": "gpt2", **params}), 400, "bad_parameter")
    assert field in detail


def test_unknown_model_is_a_404(client, learned):
    assert "nope" in error_detail(client.get("/v1/headroom", params={"model": "nope"}), 404, "unknown_model")


def test_several_models_need_a_name_with_a_shape(client, learned):
    mp.instrument(gpt2(), name="other")
    assert "model is required" in error_detail(client.get("/v1/headroom", params={"batch": 2}), 400, "bad_parameter")
    assert set(client.get("/v1/headroom").json()["models"]) == {"gpt2", "other"}


def test_capacity_off_says_so(client):
    mp.instrument(gpt2(), name="off", config={"capacity": {"enabled": False}})
    assert client.get("/v1/headroom").json()["models"]["off"] == {
        "enabled": False, "reason": "the memory model is off (capacity.enabled: false)"}


def test_the_gauges_in_metrics_match_the_route(client, learned):
    doc = client.get("/v1/headroom", params={"model": "gpt2"}).json()["models"]["gpt2"]
    table = scrape_values(client, "memprof_capacity_max_safe_batch")
    got = {dict(k)["seq_len"]: v for k, v in table.items() if dict(k)["model"] == "gpt2"}
    # each row's answer, or where it lies past capacity.max_extrapolation, the batch known to fit
    assert got == {str(r["seq_len"]): float(r["batch"] if r["batch"] is not None else r["at_least"])
                   for r in doc["max_safe_batch_rows"]}
    err = scrape_values(client, "memprof_capacity_fit_error_ratio")
    assert list(err.values()) == [pytest.approx(doc["model_fit"]["error_ratio"])]
    usable = scrape_values(client, "memprof_capacity_usable_bytes")
    assert list(usable.values()) == [pytest.approx(doc["budget"]["usable_bytes"], rel=0.01)]
    predicted = scrape_values(client, "memprof_capacity_predicted_peak_bytes")
    measured = scrape_values(client, "memprof_capacity_measured_peak_bytes")
    largest = max(doc["shapes"], key=lambda s: s["peak_increase_bytes"])
    assert list(measured.values()) == [largest["peak_increase_bytes"]]
    assert list(predicted.values())[0] == pytest.approx(largest["peak_increase_bytes"], rel=0.05)
    headroom = scrape_values(client, "memprof_capacity_headroom_bytes")
    assert 0 < list(headroom.values())[0] < doc["budget"]["available_bytes"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    return subprocess.run([sys.executable, "-m", "memprof_otel.cli", "headroom", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO)


def test_cli_prints_the_table_and_exits_3_when_a_shape_would_not_fit(server, learned):
    r = cli("--url", server.url)
    assert r.returncode == 0, r.stderr
    assert "model gpt2 on cpu" in r.stdout and "seq_len 32:" in r.stdout
    # the table says which kind of call it is about: this server's plain forwards
    assert "max safe batch (plain forwards and generate() prompts, every position's logits computed):" in r.stdout
    assert "prefill: 12 shapes; error" in r.stdout
    ok = cli("--url", server.url, "--model", "gpt2", "--batch", "2", "--seq-len", "40")
    assert ok.returncode == 0 and "fits" in ok.stdout and "would NOT fit" not in ok.stdout
    huge = cli("--url", server.url, "--model", "gpt2", "--batch", "100000000", "--seq-len", "64")
    assert huge.returncode == 3 and "would NOT fit" in huge.stdout and "extrapolates" in huge.stdout
    bad = cli("--url", server.url, "--batch", "-3")
    assert bad.returncode == 2 and bad.stdout == ""  # bad input, refused before any request
    assert bad.stderr.count("\n") == 1 and "--batch" in bad.stderr and "at least 1" in bad.stderr
    zero = cli("--url", server.url, "--batch", "0")
    assert zero.returncode == 2 and zero.stderr.count("\n") == 1 and "None" not in zero.stderr
    typo = cli("--url", server.url, "--model", "gpt2", "--batch", "2", "--feature", "seqlen=4")
    assert typo.returncode == 2 and "HTTP 400" in typo.stderr and "seqlen" in typo.stderr
    missing = cli("--url", server.url, "--model", "gpt2", "--batch", "2")
    assert missing.returncode == 2 and "missing feature [seq_len]" in missing.stderr


def test_cli_exits_4_when_it_cannot_tell(server):
    mp.instrument(gpt2(), name="fresh")
    r = cli("--url", server.url, "--model", "fresh", "--batch", "2", "--seq-len", "16")
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "no prediction: no forward measured yet" in r.stdout
