"""Single-port mode, pure parts and files: merging workers' expositions and reading the folder.

The expected merged output is checked with prometheus_client's *text* parser (another parser than
the OpenMetrics one the merge uses) on hand-written expositions."""
from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from memprof_otel.export.exposition_merge import merge_expositions, encode
from memprof_otel.export.worker_snapshots import (SnapshotWriter, read_live, render_all_workers, snapshot_path,
                                                  stale_after_s, write_snapshot)

W1 = """# HELP memprof_process_resident_memory_bytes RSS.
# TYPE memprof_process_resident_memory_bytes gauge
# UNIT memprof_process_resident_memory_bytes bytes
memprof_process_resident_memory_bytes 100.0
# HELP memprof_export_errors Failed exports.
# TYPE memprof_export_errors counter
memprof_export_errors_total{exporter="prometheus"} 2.0
# HELP memprof_build Build.
# TYPE memprof_build info
memprof_build_info{version="0.1.0"} 1.0
# HELP memprof_layer_forward_seconds Forward time.
# TYPE memprof_layer_forward_seconds summary
memprof_layer_forward_seconds_count{device="cpu",layer="fc",model="m"} 3.0
memprof_layer_forward_seconds_sum{device="cpu",layer="fc",model="m"} 0.5
# HELP memprof_operation_duration_seconds Operation time.
# TYPE memprof_operation_duration_seconds histogram
# UNIT memprof_operation_duration_seconds seconds
memprof_operation_duration_seconds_bucket{le="0.5",operation="embed"} 1.0 # {trace_id="ab12"} 0.3 1700000000.0
memprof_operation_duration_seconds_bucket{le="+Inf",operation="embed"} 2.0
memprof_operation_duration_seconds_count{operation="embed"} 2.0
memprof_operation_duration_seconds_sum{operation="embed"} 1.3
# HELP memprof_gpu GPUs.
# TYPE memprof_gpu info
# EOF
"""
W2 = W1.replace(" 100.0", " 250.0").replace('prometheus"} 2.0', 'prometheus"} 0.0').replace("_count{device=\"cpu\",layer=\"fc\",model=\"m\"} 3.0",
                                                                      "_count{device=\"cpu\",layer=\"fc\",model=\"m\"} 7.0")


def _values(body: bytes) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_parse(body.decode()) for s in fam.samples}


def test_merge_labels_every_sample_with_its_worker_and_keeps_one_family_per_name() -> None:
    merged = merge_expositions({"11": W1, "7": W2})
    body, ctype = encode(merged, "")  # Prometheus text 0.0.4
    assert ctype.startswith("text/plain")
    text = body.decode()
    # one HELP/TYPE per family, whatever the worker count (Prometheus rejects a repeated TYPE)
    assert text.count("# TYPE memprof_process_resident_memory_bytes gauge") == 1
    v = _values(body)
    assert v[("memprof_process_resident_memory_bytes", frozenset({("worker", "11")}))] == 100.0
    assert v[("memprof_process_resident_memory_bytes", frozenset({("worker", "7")}))] == 250.0
    assert v[("memprof_export_errors_total", frozenset({("exporter", "prometheus"), ("worker", "11")}))] == 2.0
    assert v[("memprof_layer_forward_seconds_count",
              frozenset({("device", "cpu"), ("layer", "fc"), ("model", "m"), ("worker", "7")}))] == 7.0
    assert v[("memprof_build_info", frozenset({("version", "0.1.0"), ("worker", "7")}))] == 1.0
    assert len(v) == 2 * 9


def _om_samples(text: str, worker: str | None = None) -> set[tuple]:
    out = set()
    for fam in om_parse(text):
        for s in fam.samples:
            labels = {**s.labels, "worker": worker} if worker is not None else s.labels
            ex = (tuple(sorted(s.exemplar.labels.items())), s.exemplar.value) if s.exemplar else None
            out.add((fam.name, fam.type, fam.unit, s.name, frozenset(labels.items()), s.value, ex))
    return out


def test_openmetrics_merge_is_what_parsing_each_worker_and_labelling_it_gives() -> None:
    # the reference: prometheus_client's OpenMetrics parser on each worker's own text, the label
    # added to every parsed sample; the merge is a text operation, checked against it
    texts = {"11": W1, "7": W2}
    merged = merge_expositions(texts)
    body, ctype = encode(merged, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text")
    expected = set().union(*(_om_samples(t, w) for w, t in texts.items()))
    assert _om_samples(body.decode()) == expected
    assert any(e[-1] == ((("trace_id", "ab12"),), 0.3) for e in expected)  # the exemplar survived
    assert [f.name for f in om_parse(body.decode())].count("memprof_gpu") == 1  # an empty family kept once


def test_a_sample_without_labels_but_with_an_exemplar_gets_the_label_before_its_value() -> None:
    text = ("# HELP memprof_x Counted.\n# TYPE memprof_x counter\n"
            'memprof_x_total 3.0 # {trace_id="ab"} 1.0 1700000000.0\n# EOF\n')
    merged = merge_expositions({"5": text})
    (fam,) = om_parse(merged.text)
    (sample,) = fam.samples
    assert sample.labels == {"worker": "5"} and sample.value == 3.0
    assert sample.exemplar is not None and sample.exemplar.labels == {"trace_id": "ab"}


def test_merge_leaves_out_a_damaged_worker_whole_and_says_which() -> None:
    merged = merge_expositions({"1": W1, "2": W1[: len(W1) // 2]})  # cut mid-file: no # EOF
    assert merged.unreadable == ["2"]
    body, ctype = encode(merged, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert b'worker="2"' not in body and b'worker="1"' in body


def test_the_services_own_figures_are_merged_once_from_the_answering_worker_without_a_worker_label() -> None:
    # GIVEN two workers that both serve the service's post-mortem count (read from its history)
    pm = ("# HELP memprof_postmortems Deaths.\n# TYPE memprof_postmortems counter\n"
          'memprof_postmortems_total{{reason="killed"}} {v}\n')
    w1 = W1.replace("# EOF\n", pm.format(v="1.0") + "# EOF\n")
    w2 = W2.replace("# EOF\n", pm.format(v="2.0") + "# EOF\n")
    # WHEN worker 9 answers the scrape
    merged = merge_expositions({"3": w1, "9": w2}, own="9")
    fams = {f.name: f for f in om_parse(merged.text)}
    # THEN the count is there once, the answering worker's, unlabelled; a sum over it counts each death once
    assert [(s.name, s.labels, s.value) for s in fams["memprof_postmortems"].samples] == \
        [("memprof_postmortems_total", {"reason": "killed"}, 2.0)]
    # AND every other family still has one sample per worker
    assert {s.labels["worker"] for s in fams["memprof_process_resident_memory_bytes"].samples} == {"3", "9"}


def test_read_live_drops_and_removes_dead_and_stale_files(tmp_path: Path) -> None:
    folder = str(tmp_path)
    for pid in (101, 102, 103, 104):
        write_snapshot(folder, pid, W1.encode())
    old = time.time() - 100
    os.utime(snapshot_path(folder, 103), (old, old))          # not rewritten for 100 s
    (tmp_path / ".memprof-abc.tmp").write_bytes(b"half")       # a writer killed mid-write
    os.utime(tmp_path / ".memprof-abc.tmp", (old, old))
    (tmp_path / "notes.txt").write_text("not ours")
    live = read_live(folder, skip_pid=104, stale_after_s=10, alive=lambda pid: pid != 102)
    assert sorted(live) == ["101"]                             # 102 dead, 103 stale, 104 is the reader
    assert sorted(p.name for p in tmp_path.iterdir()) == ["101.om", "104.om", "notes.txt"]


def test_render_all_workers_serves_the_readers_own_series_live_and_the_others_from_files(tmp_path: Path) -> None:
    write_snapshot(str(tmp_path), 5, W2.encode())
    write_snapshot(str(tmp_path), 9, W2.encode())  # the reader's own old file: its live text wins
    errors: list[str] = []
    body, _ = render_all_workers(W1.encode(), str(tmp_path), 10, "", pid=9, on_error=errors.append,
                                 alive=lambda pid: True)
    v = _values(body)
    assert v[("memprof_process_resident_memory_bytes", frozenset({("worker", "9")}))] == 100.0
    assert v[("memprof_process_resident_memory_bytes", frozenset({("worker", "5")}))] == 250.0
    assert errors == []


def test_render_all_workers_counts_an_unreadable_worker_file(tmp_path: Path) -> None:
    (tmp_path / "5.om").write_text("garbage {{{\n")
    errors: list[str] = []
    body, _ = render_all_workers(W1.encode(), str(tmp_path), 10, "", pid=9, on_error=errors.append,
                                 alive=lambda pid: True)
    assert errors == ["prometheus"]
    assert b'worker="9"' in body and b'worker="5"' not in body


def test_writer_writes_on_ticks_at_its_interval_and_counts_a_failed_write(tmp_path: Path) -> None:
    errors: list[str] = []
    w = SnapshotWriter(str(tmp_path / "snap"), 3600.0, lambda: W1.encode(), errors.append)
    w.on_sample(None)  # type: ignore[arg-type] # the writer ignores the sample's figures
    w.on_sample(None)  # type: ignore[arg-type] # within the interval: no second write
    assert w.written == 1
    assert (tmp_path / "snap" / f"{os.getpid()}.om").read_text() == W1
    w.remove()
    assert not (tmp_path / "snap" / f"{os.getpid()}.om").exists()
    w.write()  # removed: a tick racing shutdown writes nothing back
    assert not (tmp_path / "snap" / f"{os.getpid()}.om").exists()
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    bad = SnapshotWriter(str(blocked / "snap"), 0.1, lambda: b"x", errors.append)
    bad.write()
    assert errors == ["worker_snapshot"] and bad.written == 0


def test_stale_after_allows_three_missed_writes_at_the_slower_of_the_two_intervals() -> None:
    assert stale_after_s(5.0, 1.0) == 16.0
    assert stale_after_s(0.5, 2.0) == 7.0
