"""Several processes' expositions as one: the families of each, a ``worker`` label on every sample.

The single-port mode of a multi-worker server (``workers.snapshot_dir``): every worker writes its own
exposition (OpenMetrics text, so units, counter types and exemplars survive) and the worker that
answers ``/metrics`` merges them. Parsing is prometheus_client's OpenMetrics parser; pure (text in,
families out), so it is tested without files or processes.

prometheus_client's own multiprocess mode does not fit: it aggregates only the metric objects it
creates itself (values in mmap'd files) and drops custom collectors, and every figure here comes
from a custom collector at scrape time.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families

WORKER_LABEL = "worker"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@dataclass
class Merged:
    """The merged families, and the workers whose text could not be parsed (left out whole)."""

    families: list[Metric] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    def collect(self) -> Iterator[Metric]:  # what prometheus_client's encoders read
        return iter(self.families)


def merge_expositions(texts: Mapping[str, str]) -> Merged:
    """One family per name over every worker's text (``{worker: OpenMetrics text}``), each sample
    labelled ``worker=<key>``. A text that does not parse is left out whole (no half a worker);
    the first worker to show a family gives its help, type and unit."""
    out = Merged()
    by_name: dict[str, Metric] = {}
    for worker in sorted(texts, key=_numeric_first):
        try:
            parsed = list(text_string_to_metric_families(texts[worker]))
        except Exception:  # a file from another version, or damaged: the other workers still show
            out.unreadable.append(worker)
            continue
        for fam in parsed:
            merged = by_name.get(fam.name)
            if merged is None:
                merged = by_name[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                out.families.append(merged)
            elif merged.type != fam.type:
                continue  # the same name as another kind (versions differ): keep the first kind
            merged.samples.extend(s._replace(labels={**s.labels, WORKER_LABEL: worker}) for s in fam.samples)
    return out


def encode(merged: Merged, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) for ``accept``, through prometheus_client's encoders."""
    encoder, content_type = choose_encoder(accept)
    return encoder(merged), content_type  # type: ignore[arg-type] # any object with collect()


def _numeric_first(worker: str) -> tuple[int, int, str]:
    return (0, int(worker), "") if worker.isdigit() else (1, 0, worker)
