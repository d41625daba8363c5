"""Several processes' expositions as one: the families of each, a ``worker`` label on every sample.

The single-port mode of a multi-worker server (``workers.snapshot_dir``): every worker writes its own
exposition in OpenMetrics (so units, counter types and exemplars survive) and the worker that
answers ``/metrics`` merges them. Pure (text in, text out), so it is tested without files or
processes.

The merge works on the text, not through prometheus_client's parser: every file was written by this
library's own writers (prometheus_client's OpenMetrics encoder and ``layer_exposition``), so a family
is the lines from its ``# HELP`` to the next, and a sample line gets its label by an insertion after
the metric name. Parsing and re-encoding every sample instead costs ~1.5 s per scrape at four
workers of 1,000 layers, against ~45 ms for the text merge (docs/benchmarks.md), all of it holding
the GIL the answering worker's model thread needs (the problem ``layer_exposition`` solves for one
process). A client that asks for the Prometheus
text format (0.0.4) gets the merged text through prometheus_client's parser and encoder: slower,
but Prometheus itself asks for OpenMetrics.

prometheus_client's own multiprocess mode does not fit: it aggregates only the metric objects it
creates itself (values in mmap'd files) and drops custom collectors, and every figure here comes
from a custom collector at scrape time.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families

WORKER_LABEL = "worker"
# families whose figures are the service's, not one worker's: every worker serves the same value
# (the post-mortem count comes from the service's history on disk), so the merge keeps one copy,
# without a worker label, where a copy per worker would count each death once per worker
SERVICE_WIDE = frozenset({"memprof_postmortems"})
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
_EOF = "# EOF"


@dataclass
class _Family:
    header: list[str]  # "# HELP", "# TYPE", "# UNIT" lines
    kind: str
    samples: list[str] = field(default_factory=list)


@dataclass
class Merged:
    """The merged OpenMetrics text, and the workers whose text was left out (damaged, cut short)."""

    text: str
    unreadable: list[str] = field(default_factory=list)


def _families(text: str) -> list[tuple[str, _Family]] | None:
    """(name, family) in order, or None when the text is not a whole exposition of ours."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines or lines[-1] != _EOF:
        return None  # cut short: no terminator
    out: list[tuple[str, _Family]] = []
    fam: _Family | None = None
    for line in lines[:-1]:
        if line.startswith("# HELP "):
            fam = _Family([line], "")
            out.append((line.split(" ", 3)[2], fam))
        elif fam is None:
            return None  # a sample or comment before any family
        elif line.startswith("# "):
            if line.startswith("# TYPE "):
                fam.kind = line.split(" ", 3)[3] if line.count(" ") >= 3 else ""
            fam.header.append(line)
        elif line:
            fam.samples.append(line)
    return out


def _labelled(line: str, label: str) -> str:
    """``label`` (``worker="7"``) added to one sample line, first among its labels."""
    brace, space = line.find("{"), line.find(" ")
    if brace == -1 or (space != -1 and space < brace):  # no label set (a "{" later is an exemplar's)
        return f"{line[:space]}{{{label}}}{line[space:]}"
    if line.startswith("}", brace + 1):
        return f"{line[:brace]}{{{label}}}{line[brace + 2:]}"
    return f"{line[:brace + 1]}{label},{line[brace + 1:]}"


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def merge_expositions(texts: Mapping[str, str], own: str | None = None,
                      service_wide: frozenset[str] = SERVICE_WIDE) -> Merged:
    """One family per name over every worker's OpenMetrics text (``{worker: text}``), each sample
    labelled ``worker=<key>``. A text that is not whole is left out whole (no half a worker); the
    first worker to show a family gives its header; a family of another type under the same name
    (another version) is left out for that worker. A ``service_wide`` family is taken from one
    worker only (``own``, the answering one, when its text is whole), unlabelled."""
    unreadable: list[str] = []
    merged: dict[str, _Family] = {}
    order = sorted(texts, key=_numeric_first)
    if own in texts:
        order.remove(own)
        order.insert(0, own)
    for worker in order:
        fams = _families(texts[worker])
        if fams is None:
            unreadable.append(worker)
            continue
        label = f'{WORKER_LABEL}="{_label_value(worker)}"'
        for name, fam in fams:
            into = merged.get(name)
            if into is None:
                into = merged[name] = _Family(fam.header, fam.kind)
                if name in service_wide:
                    into.samples.extend(fam.samples)
                    continue
            elif into.kind != fam.kind or name in service_wide:
                continue
            into.samples.extend(_labelled(s, label) for s in fam.samples)
    return Merged(_join(merged.values()), unreadable)


def _join(families: Iterable[_Family]) -> str:
    parts: list[str] = []
    for fam in families:
        parts.extend(fam.header)
        parts.extend(fam.samples)
    parts.append(_EOF)
    return "\n".join(parts) + "\n"


class _Parsed:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:  # what prometheus_client's encoders read
        return self._families


def encode(merged: Merged, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) for ``accept``: the merged text as it is when the client takes the
    OpenMetrics version it is written in, else through prometheus_client's parser and encoder."""
    encoder, content_type = choose_encoder(accept)
    if content_type == choose_encoder(OPENMETRICS)[1]:
        return merged.text.encode("utf-8"), content_type
    return encoder(_Parsed(list(text_string_to_metric_families(merged.text)))), content_type  # type: ignore[arg-type]


def _numeric_first(worker: str) -> tuple[int, int, str]:
    return (0, int(worker), "") if worker.isdigit() else (1, 0, worker)
