"""Ranks from the launcher's variables, and what they change: labels, resource, port, exposition."""
from __future__ import annotations

import logging

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest

from memprof_otel.export.layer_exposition import render_layer_families
from memprof_otel.export.otel_settings import resource_attributes
from memprof_otel.http.workers import rank_port
import memprof_otel as mp
from memprof_otel.errors import ConfigError
from memprof_otel.telemetry.ranks import Ranks, process_labels, ranks_from
from memprof_otel.telemetry.series import LayerView

TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}


def test_a_plain_process_is_no_rank_and_gets_nothing():
    for env in ({}, {"WORLD_SIZE": "4"}, {"RANK": "x", "WORLD_SIZE": "2"}, {"LOCAL_RANK": "1"}):
        r = ranks_from(env)
        assert r == Ranks() and not r.distributed, env
        assert r.labels() == {} and r.resource_attributes() == {} and r.port_offset() == 0


@pytest.mark.parametrize("env, says", [
    ({"RANK": "\u00b2"}, "RANK='\u00b2' is not a number"),        # isdigit() but int() refuses it
    ({"RANK": "\u0663"}, "RANK='\u0663' is not a number"),        # Arabic-Indic 3: int() would read it
    ({"RANK": "-1"}, "RANK='-1' is not a number"),
    ({"RANK": "99999999999999999999999"}, "not a number below 1000000"),  # would overflow an OTel int
    ({"WORLD_SIZE": "4", "LOCAL_RANK": "2"}, "WORLD_SIZE=4 but RANK is not set"),
])
def test_variables_that_tell_no_rank_leave_a_plain_process_and_say_why_once(
        env: dict[str, str], says: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memprof_otel._log._warned", set())
    with caplog.at_level(logging.WARNING, logger="memprof_otel"):
        assert ranks_from(env) == Ranks() and process_labels(env) == {}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and says in lines[0], lines  # twice asked, once said


def test_a_local_rank_that_is_no_number_is_zero_and_said(caplog: pytest.LogCaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memprof_otel._log._warned", set())
    with caplog.at_level(logging.WARNING, logger="memprof_otel"):
        r = ranks_from({"RANK": "1", "LOCAL_RANK": "x", "WORLD_SIZE": "2"})
    assert (r.rank, r.local_rank, r.distributed) == (1, 0, True)
    assert ["LOCAL_RANK='x' is not a number" in m.getMessage() for m in caplog.records] == [True]


def test_a_rank_port_past_65535_names_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("LOCAL_RANK", "60000")
    with pytest.raises(ConfigError, match=r"9464 \+ LOCAL_RANK 60000 = 69464 is past 65535"):
        mp.serve(port=None)


def test_a_torchrun_rank():
    r = ranks_from(TORCHRUN)
    assert (r.rank, r.local_rank, r.world_size, r.distributed) == (3, 1, 4, True)
    assert r.labels() == {"rank": "3"} == process_labels(TORCHRUN)
    assert r.resource_attributes() == {"torch.distributed.rank": 3, "torch.distributed.local_rank": 1,
                                       "torch.distributed.world_size": 4}
    assert r.port_offset() == 1
    # a single-process job (torchrun --nproc_per_node=1) is still a rank; no LOCAL_RANK: 0
    assert ranks_from({"RANK": "0", "WORLD_SIZE": "1"}).labels() == {"rank": "0"}
    assert ranks_from({"RANK": "5"}).port_offset() == 0


def test_rank_port():
    assert [rank_port(9464, i) for i in range(3)] == [9464, 9465, 9466]
    assert rank_port(0, 3) == 0              # a free port, whichever
    assert rank_port(9464, 3, shared=True) == 9464  # single-port mode: one port for every process


def test_resource_attributes_carry_the_rank_and_the_environment_wins():
    ranks = ranks_from(TORCHRUN).resource_attributes()
    attrs = resource_attributes(None, "h-1-a", "1.0", {}, ranks)
    assert attrs["torch.distributed.rank"] == 3 and attrs["torch.distributed.world_size"] == 4
    assert resource_attributes(None, "h-1-a", "1.0", {"torch.distributed.rank": "7"}, ranks)[
        "torch.distributed.rank"] == "7"
    assert "torch.distributed.rank" not in resource_attributes(None, "h-1-a", "1.0", {})


def _view() -> LayerView:
    return LayerView(model='m"1', device="cpu", peaks={"": (10, 20, 5, 0.5), "a.b": (1, 2, 3, None)},
                     forward={"": (0.5, 4), "a.b": (0.25, 4)}, overhead_seconds=0.0, events_dropped=0,
                     surviving={}, unattributed={}, capacity=None)


class _Reg:
    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return self.fams


def _reference(labels: dict[str, str], openmetrics: bool) -> str:
    """What prometheus_client writes for the same gauge samples (the layer families' labels sorted)."""
    fam = GaugeMetricFamily("memprof_layer_peak_increase_bytes", "x", labels=[*labels, "device", "layer", "model"],
                            unit="bytes" if openmetrics else "")
    for path in ("", "a.b"):
        fam.add_metric([*labels.values(), "cpu", path, 'm"1'], 10.0 if path == "" else 1.0)
    text = (om_latest if openmetrics else generate_latest)(_Reg([fam])).decode()
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("memprof_layer_peak_increase_bytes{"))


def test_layer_families_carry_the_constant_labels_as_prometheus_client_writes_them():
    for openmetrics in (False, True):
        for labels in ({}, {"rank": "3"}, {"aa": "x", "rank": "3"}):
            text = render_layer_families([_view()], openmetrics, labels)
            ours = "".join(line + "\n" for line in text.splitlines()
                           if line.startswith("memprof_layer_peak_increase_bytes{"))
            assert ours == _reference(labels, openmetrics), (labels, ours)
    text = render_layer_families([_view()], False, {"rank": "3"})
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all('rank="3"' in line for line in samples)
    assert 'rank=' not in render_layer_families([_view()], False, {})


def test_every_otel_data_point_of_a_rank_carries_rank_and_a_plain_process_none():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from memprof_otel.config import OtelConfig
    from memprof_otel.export.otel import OtelExporter

    def series():
        return {"memprof_build_info": [({"version": "1", "torch_version": "2"}, 1.0)],
                "memprof_layer_peak_increase_bytes": [({"model": "m", "layer": "a", "device": "cpu"}, 5.0)]}
    for env, want in ((TORCHRUN, {"rank": "3"}), ({}, {})):
        reader = InMemoryMetricReader()
        exp = OtelExporter(OtelConfig(), None, series, lambda _: None,
                           meter_provider=MeterProvider(metric_readers=[reader]), environ=env)
        points = [(m.name, dict(p.attributes)) for rm in reader.get_metrics_data().resource_metrics
                  for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points]
        assert points
        for name, attrs in points:
            assert {k: attrs[k] for k in attrs if k == "rank"} == want, (name, attrs)
        assert any(a.get("layer") == "a" for _, a in points)  # the layer gauge was observed too
        exp.shutdown(1.0)
