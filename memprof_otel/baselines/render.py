"""A ``BaselineDiff`` for people: a fixed-width table for a CI log, a markdown one for a PR comment.
Both say the same things in the same order: the verdict, the environment and inputs that differ,
the changed figures (largest first), the layers renamed, added and removed."""
from __future__ import annotations

from collections.abc import Sequence

from ..units import format_bytes
from .diff import BaselineDiff, FigureChange
from .schema import BYTE_FIGURES
from .shapes import MIN_FORWARDS

# the figure names as the tables show them
LABELS = {"peak_increase_bytes": "peak increase", "retained_bytes": "retained", "calls": "calls",
          "allocations": "allocations", "deallocations": "deallocations"}
MAX_ROWS = 50  # a diff of every layer of a large model is a wall; the JSON form has them all


def _value(figure: str, n: int) -> str:
    return f"{format_bytes(n)} ({n:,} B)" if figure in BYTE_FIGURES else f"{n:,}"


def _delta(figure: str, n: int) -> str:
    sign = "+" if n > 0 else "-"
    return sign + (format_bytes(abs(n)) if figure in BYTE_FIGURES else f"{abs(n):,}")


def _relative(c: FigureChange) -> str:
    r = c.relative
    return "new" if r is None else f"{r:+.1%}"


def _layer(path: str) -> str:
    return path if path else "(root)"


def _row(c: FigureChange) -> list[str]:
    name = _layer(c.layer) if c.layer == c.old_layer else f"{_layer(c.layer)} (was {_layer(c.old_layer)})"
    if c.shape is not None:
        name += f" [{c.shape or 'shape not read'}]"
    change = _delta(c.figure, c.delta)
    if c.noise:
        change += f" (noise {_delta(c.figure, c.noise)[1:]})"
    return [name, LABELS[c.figure], _value(c.figure, c.old), _value(c.figure, c.new), change,
            _relative(c), "FAIL" if c.exceeds else ""]


def verdict(d: BaselineDiff) -> str:
    n = len(d.failures)
    limits = []
    if d.thresholds.fail_above is not None:
        limits.append(f"{d.thresholds.fail_above:.2%}")
    if d.thresholds.fail_above_bytes is not None:
        limits.append(format_bytes(d.thresholds.fail_above_bytes))
    if n:
        return f"FAIL: {n} figure{'s' if n != 1 else ''} grew by more than {' and '.join(limits)}"
    if d.judged_nothing:
        why = "the two baselines share no shape measured enough on both sides"
        return f"FAIL: nothing compared: {why}" if d.thresholds.any else f"nothing compared: {why}"
    if d.unchanged:
        return ("no change beyond the noise of repeat forwards" if d.per_shape
                else "no change: every layer's figures are the same")
    return "ok: " + (f"nothing grew by more than {' and '.join(limits)}" if limits else "no threshold set")


def _facts(d: BaselineDiff) -> list[str]:
    out = []
    if d.old_model != d.new_model:
        out.append(f"model: {d.old_model} -> {d.new_model}")
    out += [f"environment {k}: {o} -> {n}" for k, (o, n) in d.environment.items()]
    out += [f"input {k}: {o} -> {n}" for k, (o, n) in d.inputs.items()]
    if d.structure_changed:
        out.append("structure: the model's layers differ (fingerprints differ)")
    if d.per_shape:
        out.append(f"compared shape by shape: {len(d.shapes_compared)} shape"
                   f"{'s' if len(d.shapes_compared) != 1 else ''} on both sides"
                   + (f" ({'; '.join(k or 'shape not read' for k in d.shapes_compared)})" if d.shapes_compared else ""))
    if d.shapes_only_old:
        out.append(f"only in the old baseline, not judged: {'; '.join(k or 'shape not read' for k in d.shapes_only_old)}")
    if d.shapes_only_new:
        out.append(f"only in the new baseline, not judged: {'; '.join(k or 'shape not read' for k in d.shapes_only_new)}")
    if any(d.unread_forwards):
        out.append(f"shape not read, not judged: {d.unread_forwards[0]} and {d.unread_forwards[1]} forwards "
                   "(the memory model's shape features are off, or a shape_of raised)")
    for k, a, b in d.shapes_too_few:
        out.append(f"unknown, too few forwards to know the noise ({a} and {b}, at least "
                   f"{MIN_FORWARDS} a side): {k or 'shape not read'}")
    return out


def _layer_lists(d: BaselineDiff) -> list[str]:
    out = [f"renamed: {_layer(o)} -> {_layer(n)}" for o, n in d.renamed]
    out += [f"added: {_layer(lay.path)} (peak increase {format_bytes(lay.peak_increase_bytes)})" for lay in d.added]
    out += [f"removed: {_layer(lay.path)} (peak increase {format_bytes(lay.peak_increase_bytes)})"
            for lay in d.removed]
    return out


HEADER = ["layer", "figure", "old", "new", "change", "relative", ""]


def _rows(d: BaselineDiff) -> tuple[list[list[str]], int]:
    rows = [_row(c) for c in d.changes[:MAX_ROWS]]
    return rows, max(0, len(d.changes) - MAX_ROWS)


def text(d: BaselineDiff) -> str:
    """The table for a terminal or a CI log: columns padded, numbers right-aligned."""
    lines = [f"memprof-otel diff: {verdict(d)}"] + [f"  {f}" for f in _facts(d)]
    rows, more = _rows(d)
    if rows:
        table = [HEADER] + rows
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
        right = {2, 3, 4, 5}
        lines.append("")
        for r in table:
            cells = [r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(r))]
            lines.append("  ".join(cells).rstrip())
        if more:
            lines.append(f"... and {more} more changed figures (--json lists them all)")
    lists = _layer_lists(d)
    if lists:
        lines += [""] + lists
    return "\n".join(lines)


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|")


def _md_table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i in (2, 3, 4, 5) else "---"
                                                               for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return out


def markdown(d: BaselineDiff) -> str:
    """The same for a pull-request comment: a heading with the verdict, a table, bullet lists."""
    icon = ":x:" if d.failed else ":white_check_mark:"
    lines = [f"### {icon} memprof-otel diff: {verdict(d)}", ""]
    facts = _facts(d)
    if facts:
        lines += [f"- {f}" for f in facts] + [""]
    rows, more = _rows(d)
    if rows:
        lines += _md_table([h or "verdict" for h in HEADER],
                           [[f"`{r[0]}`", *r[1:6], "**FAIL**" if r[6] else ""] for r in rows])
        if more:
            lines.append(f"\n… and {more} more changed figures")
        lines.append("")
    lists = _layer_lists(d)
    if lists:
        lines += [f"- {item}" for item in lists]
    return "\n".join(lines).rstrip() + "\n"
