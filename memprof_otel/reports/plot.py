"""The 4-panel PNG behind ``mp.plot(path)``: memory with phases, CPU, disk I/O per phase, durations.

``io_per_operation`` is pure. ``build_figure`` draws on a private ``matplotlib.figure.Figure`` with
the Agg canvas (no pyplot, no global state: safe from a server thread). ``plot_timeline`` writes it
atomically. matplotlib is imported only when a figure is drawn (the ``plots`` extra).
"""
from __future__ import annotations

import bisect
import io
import os
import time
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ExportError, MemprofError  # noqa: F401  (ExportError: documented raise)
from ..files import write_bytes_atomic
from ..timeline import OperationRecord, Timeline
from ..units import format_bytes
from .text import operation_at, ordered_operations

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGSIZE = (16.0, 10.0)
DPI = 100
MAX_BARS = 20            # panels 3 and 4 show at most this many operations
_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))


# ---------------------------------------------------------------- pure helpers

def _value_at(ts: Sequence[float], values: Sequence[int], t: float) -> float:
    """Linear interpolation of a cumulative counter at ``t``, clamped to the first/last sample."""
    if not ts or not values:
        return 0.0
    n = min(len(ts), len(values))
    if t <= ts[0]:
        return float(values[0])
    if t >= ts[n - 1]:
        return float(values[n - 1])
    i = bisect.bisect_right(ts, t, 0, n)
    t0, t1, v0, v1 = ts[i - 1], ts[i], values[i - 1], values[i]
    return float(v1) if t1 <= t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def io_per_operation(timeline: Timeline) -> list[tuple[str, int, int]]:
    """``(name, read_bytes, write_bytes)`` per operation in start order: the difference of the
    cumulative I/O counters (interpolated between samples) over the operation; an open one up to
    the last sample. Never negative (a counter reset reads as 0)."""
    ts = timeline.timestamps
    out = []
    for op in timeline.operations:
        end = op.end if op.end is not None else (ts[-1] if ts else op.start)
        r = _value_at(ts, timeline.io_read_bytes, end) - _value_at(ts, timeline.io_read_bytes, op.start)
        w = _value_at(ts, timeline.io_write_bytes, end) - _value_at(ts, timeline.io_write_bytes, op.start)
        out.append((op.name, max(0, round(r)), max(0, round(w))))
    return out


def byte_unit(max_value: float) -> tuple[str, int]:
    """The IEC unit a y axis reads best in: the largest one that is <= ``max_value``."""
    for name, size in _UNITS:
        if max_value >= size:
            return name, size
    return "B", 1


def time_unit(span_seconds: float) -> tuple[str, float]:
    if span_seconds > 3 * 3600:
        return "h", 3600.0
    if span_seconds > 600:
        return "min", 60.0
    return "s", 1.0


# ---------------------------------------------------------------- drawing

def _require_matplotlib() -> tuple[Any, Any]:
    try:
        # why: optional: matplotlib comes with the plots extra
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MemprofError("plotting needs matplotlib: pip install 'memprof-otel[plots]'") from None
    return Figure, FigureCanvasAgg


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.45")
    ax.set_xticks([])
    ax.set_yticks([])


def _colours(ops: Sequence[OperationRecord]) -> dict[str, Any]:
    from matplotlib import colormaps  # why: optional: matplotlib comes with the plots extra
    cmap = colormaps["Set2"]  # soft colours: the data lines on top stay the strongest marks
    out: dict[str, Any] = {}
    for op in ops:
        if op.name not in out:
            out[op.name] = cmap(len(out) % cmap.N)
    return out


def _bar_ops(ops: list[tuple[int, OperationRecord]]) -> tuple[list[tuple[int, OperationRecord]], int]:
    """What panels 3-4 show (and how many are left out): everything if it fits, else the first
    MAX_BARS top-level records."""
    shown = ops if len(ops) <= MAX_BARS else [(d, o) for d, o in ops if d == 0][:MAX_BARS]
    return shown, len(ops) - len(shown)


def build_figure(timeline: Timeline) -> "Figure":
    """The 4-panel figure (not yet saved). Raises MemprofError without matplotlib."""
    Figure, FigureCanvasAgg = _require_matplotlib()
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(3, 2, height_ratios=[1.5, 0.6, 1.0])
    ax_mem = fig.add_subplot(gs[0, :])
    ax_cpu = fig.add_subplot(gs[1, :], sharex=ax_mem)
    ax_io = fig.add_subplot(gs[2, 0])
    ax_dur = fig.add_subplot(gs[2, 1])

    ts = timeline.timestamps
    ops = timeline.operations
    ordered = ordered_operations(ops)
    colours = _colours([o for _, o in ordered])

    if not ts or not timeline.rss_bytes:
        fig.suptitle("memprof-otel memory profile: no samples yet", fontsize=15, fontweight="bold")
        for ax in (ax_mem, ax_cpu):
            _no_data(ax, "no data: no samples recorded yet")
    else:
        _draw_memory_and_cpu(fig, ax_mem, ax_cpu, timeline, ordered, colours)
    if not ops:
        for ax in (ax_io, ax_dur):
            _no_data(ax, "no operations recorded\n(use mp.operation() or mp.mark_operation())")
    else:
        shown, hidden = _bar_ops(ordered)
        _draw_io(ax_io, timeline, shown, hidden, colours)
        _draw_durations(ax_dur, timeline, shown, hidden, colours)
    ax_mem.set_title("Memory timeline", loc="left", fontweight="bold")
    ax_cpu.set_title("CPU utilization", loc="left", fontweight="bold")
    ax_io.set_title("Disk I/O per operation", loc="left", fontweight="bold")
    ax_dur.set_title("Operation durations", loc="left", fontweight="bold")
    return fig


def _draw_memory_and_cpu(fig: Any, ax_mem: Any, ax_cpu: Any, tl: Timeline,
                         ordered: list[tuple[int, OperationRecord]], colours: dict[str, Any]) -> None:
    from matplotlib.patches import Patch  # why: optional: matplotlib comes with the plots extra

    n = min(len(tl.timestamps), len(tl.rss_bytes))  # equal unless a hand-made dict disagrees
    ts, rss = tl.timestamps[:n], tl.rss_bytes[:n]
    allocated = {dev: vals[:n] for dev, vals in sorted(tl.allocated.items())}
    t0 = min([ts[0], *(o.start for o in tl.operations)])
    t_end = ts[-1]
    tname, tdiv = time_unit(t_end - t0)
    xs = [(t - t0) / tdiv for t in ts]
    series_max = max([*rss, *(v for vals in allocated.values() for v in vals), 0])
    uname, usize = byte_unit(series_max)

    ax_mem.plot(xs, [v / usize for v in rss], color="#1f3b73", lw=2.0, label="process RSS", zorder=3)
    styles = ["--", "-.", ":"]
    dev_colours = ["#c0392b", "#7d3c98", "#117864", "#b9770e"]
    for i, (dev, vals) in enumerate(allocated.items()):
        ax_mem.plot(xs[:len(vals)], [v / usize for v in vals], ls=styles[i % 3], lw=1.6,
                    color=dev_colours[i % 4], label=f"{dev} allocated", zorder=3)

    legend_spans: dict[str, Any] = {}
    for depth, op in ordered:
        a = (op.start - t0) / tdiv
        b = ((op.end if op.end is not None else t_end) - t0) / tdiv
        c = colours[op.name]
        if depth == 0:
            ax_mem.axvspan(a, b, color=c, alpha=0.25, lw=0, zorder=1)
            ax_cpu.axvspan(a, b, color=c, alpha=0.25, lw=0, zorder=1)
        else:  # nested: a band along the top so the phase underneath stays readable
            ax_mem.axvspan(a, b, ymin=0.93, ymax=1.0, color=c, alpha=0.55, lw=0, zorder=2)
        legend_spans.setdefault(op.name, Patch(facecolor=c, alpha=0.45 if depth == 0 else 0.7,
                                               label=op.name + (" (nested)" if depth else "")))

    # the peak
    i_peak = max(range(n), key=lambda i: (rss[i], -i))
    peak_b, peak_t = rss[i_peak], ts[i_peak]
    peak_op = operation_at(tl.operations, peak_t)
    during = f" during {peak_op.name}" if peak_op else ""
    ymax = series_max / usize if series_max else 1.0
    ax_mem.set_ylim(0, ymax * 1.18)
    ax_mem.plot([xs[i_peak]], [peak_b / usize], marker="o", ms=9, color="#e74c3c", zorder=4, clip_on=False)
    x_frac = (xs[i_peak] - xs[0]) / ((xs[-1] - xs[0]) or 1)
    ax_mem.annotate(f"peak {format_bytes(peak_b)}{during}", xy=(xs[i_peak], peak_b / usize),
                    xytext=(-40 if x_frac > 0.7 else 40, 10), textcoords="offset points",
                    ha="right" if x_frac > 0.7 else "left", va="bottom", fontsize=11,
                    fontweight="bold", color="#a93226",
                    bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#e74c3c", "alpha": 0.9},
                    arrowprops={"arrowstyle": "->", "color": "#e74c3c", "lw": 1.4}, zorder=5)
    ax_mem.set_ylabel(f"memory ({uname})")
    ax_mem.grid(True, alpha=0.3)
    handles = ax_mem.get_legend_handles_labels()[0] + list(legend_spans.values())[:12]
    # above the plot, right of the panel title: never on top of the data or the nested bands
    ax_mem.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=9,
                  frameon=False, ncol=len(handles) if len(handles) <= 9 else -(-len(handles) // 2),
                  borderaxespad=0.2, handlelength=1.8, columnspacing=1.2)
    x_max = max([xs[-1], *(((o.end or t_end) - t0) / tdiv for o in tl.operations)])
    ax_mem.set_xlim(0, x_max if x_max > 0 else 1.0)
    ax_mem.tick_params(labelbottom=False)

    cpu = [min(100.0, max(0.0, c * 100.0)) for c in tl.cpu_ratio[:n]]
    ax_cpu.plot(xs[:len(cpu)], cpu, color="#1f3b73", lw=1.2, zorder=3)
    ax_cpu.set_ylim(0, 105)
    ax_cpu.set_yticks([0, 25, 50, 75, 100])
    ax_cpu.set_ylabel("CPU (%)")
    ax_cpu.set_xlabel(f"time since start ({tname})")
    ax_cpu.grid(True, alpha=0.3)

    when = time.strftime("%H:%M:%S", time.localtime(peak_t))
    fig.suptitle(f"memprof-otel memory profile: peak RSS {format_bytes(peak_b)} at {when}{during}",
                 fontsize=15, fontweight="bold")


def _bar_labels(shown: list[tuple[int, OperationRecord]]) -> list[str]:
    return [("  " * d + ("└ " if d else "")) + o.name for d, o in shown]


def _draw_io(ax: Any, tl: Timeline, shown: list[tuple[int, OperationRecord]], hidden: int,
             colours: dict[str, Any]) -> None:
    per_op = dict(zip((id(o) for o in tl.operations), io_per_operation(tl)))
    rows = [per_op[id(o)] for _, o in shown]
    top = max([0, *(r for _, r, _ in rows), *(w for _, _, w in rows)])
    uname, usize = byte_unit(top)
    xs = range(len(rows))
    width = 0.38
    rb = ax.bar([x - width / 2 for x in xs], [r / usize for _, r, _ in rows], width,
                label="read", color="#2874a6")
    wb = ax.bar([x + width / 2 for x in xs], [w / usize for _, _, w in rows], width,
                label="write", color="#e67e22")
    for bars, vals in ((rb, [r for _, r, _ in rows]), (wb, [w for _, _, w in rows])):
        for bar, v in zip(bars, vals):
            if v > 0:
                ax.annotate(format_bytes(v), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                            fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(_bar_labels(shown), rotation=30 if len(rows) > 4 else 0,
                       ha="right" if len(rows) > 4 else "center", fontsize=9)
    ax.set_ylabel(f"bytes ({uname})")
    ax.set_ylim(0, (top / usize if top else 1.0) * 1.2)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    if not top:
        ax.text(0.5, 0.5, "no disk I/O recorded during these operations", ha="center", va="center",
                transform=ax.transAxes, fontsize=11, color="0.45")
    _hidden_note(ax, hidden)


def _draw_durations(ax: Any, tl: Timeline, shown: list[tuple[int, OperationRecord]], hidden: int,
                    colours: dict[str, Any]) -> None:
    t_end = max([*tl.timestamps[-1:], *(o.end for o in tl.operations if o.end is not None),
                 *(o.start for o in tl.operations)])
    durs = [(o.duration if not o.open else max(0.0, t_end - o.start)) for _, o in shown]
    ys = list(range(len(shown)))
    bars = ax.barh(ys, durs, color=[colours[o.name] for _, o in shown], alpha=0.85,
                   hatch=None, edgecolor="white")
    for bar, (_, o) in zip(bars, shown):
        if o.open:
            bar.set_hatch("//")
    longest = max(durs) if durs else 0.0
    for y, d, (_, o) in zip(ys, durs, shown):
        txt = f"{d:.1f}s" + (" (running)" if o.open else "")
        ax.text(d + longest * 0.01, y, txt, va="center", ha="left", fontsize=9)
    ax.set_yticks(ys)
    ax.set_yticklabels(_bar_labels(shown), fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, (longest or 1.0) * 1.18)
    ax.set_xlabel("duration (s)")
    ax.grid(True, axis="x", alpha=0.3)
    _hidden_note(ax, hidden)


def _hidden_note(ax: Any, hidden: int) -> None:
    if hidden:
        ax.text(1.0, 1.01, f"{hidden} more not shown", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=9, color="0.4")


# ---------------------------------------------------------------- writer

def render_png(timeline: Timeline) -> bytes:
    buf = io.BytesIO()
    build_figure(timeline).savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def plot_timeline(timeline: Timeline, path: str | os.PathLike[str]) -> None:
    """Draw the 4-panel PNG of ``timeline`` to ``path`` (atomically). Raises MemprofError without
    matplotlib, ExportError when ``path`` cannot be written."""
    write_bytes_atomic(render_png(timeline), path)
