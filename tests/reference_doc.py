"""Reads docs/reference.md, the user-facing reference, so that tests check the code against it.

The reference is the project's own statement of its public names: the tests compare its metric
tables with the metric catalog and a live /metrics, its route table with the router and
/openapi.json, its configuration table with the config loader and its CLI table with the command
list. These helpers only parse the document; they know nothing of the code.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

from memprof_otel.testing import pytest_plugin

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference.md"
README = REPO / "README.md"


class MetricRow(NamedTuple):
    name: str                 # Prometheus family name as scraped
    kind: str                 # gauge | counter | histogram | summary | info
    labels: tuple[str, ...]
    otel: str                 # OTel instrument name
    unit: str                 # OTel unit ("" where the table says "—")
    meaning: str


@functools.cache
def text() -> str:
    return REFERENCE.read_text(encoding="utf-8")


@functools.cache
def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(title: str, doc: str | None = None) -> str:
    """The body of the ``## title`` section of ``doc`` (the reference by default), up to the next
    ``## `` heading (subsections included)."""
    body = text() if doc is None else doc
    m = re.search(rf"^## {re.escape(title)}[ \t]*\n", body, re.M)
    if m is None:
        raise LookupError(f"no '## {title}' section")
    end = re.search(r"^## ", body[m.end():], re.M)
    return body[m.end(): m.end() + end.start() if end else None]


def table_rows(body: str) -> list[list[str]]:
    """Data rows of the Markdown tables in ``body`` (those whose first cell is backticked), as cells."""
    rows = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("| `"):
            rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def _backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def first_code(cell: str) -> str:
    codes = _backticked(cell)
    if not codes:
        raise ValueError(f"no backticked name in table cell {cell!r}")
    return codes[0]


def documented_metrics() -> dict[str, MetricRow]:
    """Every row of the metric tables under "Prometheus metrics", by Prometheus name."""
    out: dict[str, MetricRow] = {}
    for cells in table_rows(section("Prometheus metrics")):
        if len(cells) != 6:
            raise ValueError(f"metric row needs 6 cells (metric, type, labels, OTel instrument, OTel unit, "
                             f"meaning), got {cells}")
        name, kind, labels, otel, unit, meaning = cells
        row = MetricRow(first_code(name), kind, tuple(_backticked(labels)), first_code(otel),
                        "" if unit in ("—", "-", "") else first_code(unit), meaning)
        if row.name in out:
            raise ValueError(f"{row.name} is listed twice")
        out[row.name] = row
    return out


def metric_names_mentioned() -> set[str]:
    """Every ``memprof_*`` metric name written anywhere in the document (the import package
    ``memprof_otel``, and the pytest plugin's fixture and ini option, aside)."""
    not_metrics = {"memprof_otel", pytest_plugin.FIXTURE, pytest_plugin.DIR_INI}
    return set(re.findall(r"\bmemprof_[a-z0-9_]*[a-z0-9]", text())) - not_metrics


def documented_routes() -> set[tuple[str, str]]:
    """(method, path) of every row of the route table; query strings dropped."""
    routes = set()
    for cells in table_rows(section("HTTP endpoint")):
        routes.update(re.findall(r"`(GET|PUT|POST|DELETE|PATCH) (/[^?`\s]*)", cells[0]))
    return routes


def heading_anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading: lower case, punctuation but
    ``-`` and ``_`` dropped, spaces made ``-`` (`` `GET /v1/dumps/{id}` `` -> ``get-v1dumpsid``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def route_table_links() -> dict[tuple[str, str], list[str]]:
    """(method, path) of each route-table row -> the in-page anchors its cells link to."""
    out: dict[tuple[str, str], list[str]] = {}
    for cells in table_rows(section("HTTP endpoint")):
        for route in re.findall(r"`(GET|PUT|POST|DELETE|PATCH) (/[^?`\s]*)", cells[0]):
            out[route] = re.findall(r"\]\(#([^)\s]+)\)", " | ".join(cells[1:]))
    return out


def route_details() -> dict[tuple[str, str], str]:
    """(method, path) -> the body of its ``#### `METHOD /path` `` section under "HTTP endpoint",
    where a route's answer takes more than the table's one line."""
    body = section("HTTP endpoint")
    out: dict[tuple[str, str], str] = {}
    heads = list(re.finditer(r"^#### `(GET|PUT|POST|DELETE|PATCH) (/[^`\s]*)`[ \t]*$", body, re.M))
    for m in heads:
        end = re.search(r"^#{1,4} ", body[m.end():], re.M)
        out[(m.group(1), m.group(2))] = body[m.end(): m.end() + end.start() if end else None].strip()
    return out


def headings(doc: str | None = None) -> list[str]:
    """The text of every heading of ``doc`` (the reference by default), ``#`` marks dropped; a
    comment line in a fenced code block is no heading."""
    prose = re.sub(r"^```.*?^```", "", text() if doc is None else doc, flags=re.M | re.S)
    return re.findall(r"^#{1,6} (.+?)[ \t]*$", prose, re.M)


def documented_config() -> dict[str, str]:
    """Dotted config key -> the default as written in the configuration table."""
    return {first_code(cells[0]): cells[1] for cells in table_rows(section("Configuration"))}


def documented_commands() -> set[str]:
    """Subcommand names from the CLI table (``memprof-otel info [--json]`` -> ``info``)."""
    out = set()
    for cells in table_rows(section("CLI")):
        words = first_code(cells[0]).split()
        if words[0] != "memprof-otel" or len(words) < 2:
            raise ValueError(f"CLI row must start with `memprof-otel COMMAND`: {cells[0]}")
        out.add(words[1])
    return out


def documented_command_options() -> dict[str, set[str]]:
    """Subcommand -> every option its CLI row names (``--model``, ``-o``), in either cell."""
    out: dict[str, set[str]] = {}
    for cells in table_rows(section("CLI")):
        command = first_code(cells[0]).split()[1]
        out[command] = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b", " ".join(cells)))
    return out


class ApiLine(NamedTuple):
    owner: str                 # "mp" (the package) or "h" (an Instrumentation)
    name: str
    params: tuple[str, ...]    # as written: "model", "name=\"encoder\"", "*", "**overrides"
    returns: str | None        # the name after "->", if written


def api_block() -> str:
    """The code block of the "Python API" section."""
    m = re.search(r"```python\n(.*?)```", section("Python API"), re.S)
    if m is None:
        raise LookupError("no python block in the Python API section")
    return m.group(1)


def documented_api() -> dict[tuple[str, str], ApiLine]:
    """The first ``mp.NAME(...)`` / ``h.NAME(...)`` written for each name in the Python API block
    (later ones are examples), with what its comment-free line says it returns."""
    out: dict[tuple[str, str], ApiLine] = {}
    for line in api_block().splitlines():
        code = line.split("#", 1)[0]
        for m in re.finditer(r"\b(mp|h)\.(\w+)\(([^()]*)\)(?:\s*->\s*([\w.\[\], |]+?))?\s*(?:$|;|/|:|\bas\b)", code):
            owner, name, args, ret = m.groups()
            params = tuple(a.strip() for a in args.split(",") if a.strip())
            out.setdefault((owner, name), ApiLine(owner, name, params, ret.strip() if ret else None))
    return out


def documented_errors(body: str) -> set[str]:
    """The class names written backticked in ``body`` (``MemprofError``, ``memprof_otel.ConfigError``)."""
    return {n.rsplit(".", 1)[-1] for n in re.findall(r"`((?:memprof_otel\.)?[A-Z][A-Za-z]+)`", body)}
