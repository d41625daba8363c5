import subprocess
import sys
import time


from memprof_otel.reports.text import PeakInfo, find_peak, format_report, operation_at, ordered_operations, signed_bytes
from memprof_otel.timeline import OperationRecord, Sample

GiB = 1024**3
MiB = 1024**2
T0 = 1_700_000_000.0


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def sample(dt: float, rss: float, op: str | None = None, **process: float) -> Sample:
    return Sample(t=T0 + dt, process={"resident_memory_bytes": float(rss), **process}, operation=op)


def op(id: int, name: str, start: float, end: float | None, rss_start: float, rss_end: float | None,
       kind: str = "phase", parent_id: int | None = None, **kw) -> OperationRecord:
    return OperationRecord(id=id, name=name, kind=kind, start=T0 + start, rss_start=int(rss_start),
                           end=None if end is None else T0 + end,
                           rss_end=None if rss_end is None else int(rss_end), parent_id=parent_id, **kw)


def three_phase_run() -> tuple[list[Sample], list[OperationRecord]]:
    """load 0-10 s (0.5 -> 1.5 GiB), compile 10-30 s (peaks 3 GiB at 20 s, ends 2 GiB),
    generate 30-40 s (ends 2.5 GiB)."""
    samples = [sample(0, 0.5 * GiB, "load"), sample(5, 1.0 * GiB, "load"), sample(10, 1.5 * GiB, "compile"),
               sample(20, 3.0 * GiB, "compile"), sample(30, 2.0 * GiB, "generate"),
               sample(35, 2.25 * GiB, "generate"), sample(40, 2.5 * GiB, "generate")]
    ops = [op(1, "load", 0, 10, 0.5 * GiB, 1.5 * GiB), op(2, "compile", 10, 30, 1.5 * GiB, 2.0 * GiB),
           op(3, "generate", 30, 40, 2.0 * GiB, 2.5 * GiB)]
    return samples, ops


def test_three_phase_report_exact_lines():
    samples, ops = three_phase_run()
    lines = format_report(samples, ops).splitlines()
    assert lines == [
        "MEMPROF-OTEL MEMORY REPORT",
        "=" * 60,
        "Peak Memory Usage:",
        f"   • RSS (Physical): 3.0 GiB at {clock(T0 + 20)}",
        "   • Peak during:    compile",
        "",
        "Memory Statistics:",
        "   • Current RSS:    2.5 GiB (Delta: +2.0 GiB)",
        "   • Duration:       40.0 seconds",
        "   • Operations:     3",
        "",
        "Operations Timeline:",
        "    1.    0.0s - load (10.0s) [+1.0 GiB]",
        "    2.   10.0s - compile (20.0s) [+512.0 MiB] <- Peak",
        "    3.   30.0s - generate (10.0s) [+512.0 MiB]",
    ]


def test_find_peak_returns_largest_rss_and_covering_phase():
    samples, ops = three_phase_run()
    assert find_peak(samples, ops) == PeakInfo(3 * GiB, T0 + 20, ops[1])
    assert find_peak([], ops) is None


def test_peak_on_a_phase_boundary_goes_to_the_phase_that_starts_there():
    samples, ops = three_phase_run()
    samples[2] = sample(10, 5 * GiB)  # exactly when load ends and compile starts
    assert find_peak(samples, ops).operation is ops[1]


def test_operation_beats_phase_and_innermost_wins():
    phase = op(1, "compile", 0, 30, 0, 0)
    outer = op(2, "trace", 5, 25, 0, 0, kind="operation")
    inner = op(3, "lower", 10, 20, 0, 0, kind="operation", parent_id=2)
    later_phase = op(4, "late", 12, 18, 0, 0)  # a phase starting later still loses to an operation
    ops = [phase, outer, inner, later_phase]
    assert operation_at(ops, T0 + 15) is inner
    assert operation_at(ops, T0 + 22) is outer
    assert operation_at(ops, T0 + 2) is phase
    assert operation_at(ops, T0 + 31) is None


def test_peak_falls_back_to_the_sample_operation_name():
    samples = [sample(0, GiB), sample(50, 4 * GiB, "generate"), sample(60, GiB)]
    ops = [op(1, "generate", 10, 20, GiB, GiB), op(2, "generate", 30, 40, GiB, 2 * GiB),
           op(3, "other", 0, 5, 0, 0)]
    peak = find_peak(samples, ops)
    assert peak.rss_bytes == 4 * GiB and peak.operation is ops[1]  # the latest one started by then


def test_peak_outside_any_operation():
    samples = [sample(0, GiB), sample(5, 2 * GiB), sample(10, GiB)]
    report = format_report(samples, [op(1, "load", 6, 10, GiB, GiB)])
    assert "   • Peak during:    (no operation)" in report
    assert "<- Peak" not in report


def test_nested_operations_are_indented_and_numbered_under_their_parent():
    samples = [sample(0, GiB), sample(12, 2 * GiB), sample(20, 1.5 * GiB), sample(40, GiB)]
    ops = [
        op(1, "load", 0, 10, GiB, GiB),
        op(2, "compile", 10, 30, GiB, 1.5 * GiB),
        op(5, "optimize", 15, 18, 1.5 * GiB, 1.5 * GiB, kind="operation", parent_id=2),
        op(4, "trace", 11, 14, GiB, 2 * GiB, kind="operation", parent_id=2),
        op(6, "lower", 12, 13, GiB, 1.25 * GiB, kind="operation", parent_id=4),
        op(3, "generate", 30, 40, 1.5 * GiB, GiB),
    ]
    lines = format_report(samples, ops).splitlines()
    timeline = lines[lines.index("Operations Timeline:") + 1:]
    assert timeline == [
        "    1.    0.0s - load (10.0s) [+0 B]",
        "    2.   10.0s - compile (20.0s) [+512.0 MiB]",
        "      2.1.   11.0s - trace (3.0s) [+1.0 GiB]",
        "        2.1.1.   12.0s - lower (1.0s) [+256.0 MiB] <- Peak",
        "      2.2.   15.0s - optimize (3.0s) [+0 B]",
        "    3.   30.0s - generate (10.0s) [-512.0 MiB]",
    ]
    assert "   • Operations:     6" in lines


def test_open_operation_shows_running_with_delta_so_far():
    samples = [sample(0, GiB, "load"), sample(5, 2.5 * GiB, "load"), sample(10, 2 * GiB, "generate"),
               sample(15, 1.75 * GiB, "generate")]
    ops = [op(1, "load", 0, 10, GiB, 2 * GiB), op(2, "generate", 10, None, 2 * GiB, None)]
    lines = format_report(samples, ops).splitlines()
    assert lines[-1] == "    2.   10.0s - generate (running) [-256.0 MiB so far]"
    assert lines[-2] == "    1.    0.0s - load (10.0s) [+1.0 GiB] <- Peak"
    assert "   • Duration:       15.0 seconds" in lines
    assert "   • Duration:       20.0 seconds" in format_report(samples, ops, now=T0 + 20).splitlines()


def test_peak_in_open_operation_is_marked():
    samples = [sample(0, GiB), sample(10, 3 * GiB)]
    ops = [op(1, "generate", 5, None, GiB, None)]
    report = format_report(samples, ops)
    assert "Peak during:    generate" in report
    assert report.splitlines()[-1].endswith("(running) [+2.0 GiB so far] <- Peak")


def test_errors_and_oom_are_flagged():
    samples = [sample(0, GiB), sample(10, GiB)]
    ops = [op(1, "generate", 0, 10, GiB, GiB, kind="operation", error="OutOfMemoryError", oom=True)]
    assert format_report(samples, ops).splitlines()[-1] == (
        "    1.    0.0s - generate (10.0s) [+0 B] [OOM] [raised OutOfMemoryError] <- Peak")


def test_allocator_devices_get_their_own_peak_line():
    samples = [Sample(T0, {"resident_memory_bytes": GiB}, {"cuda:0": {"allocated_bytes": 2 * GiB}}),
               Sample(T0 + 1, {"resident_memory_bytes": GiB}, {"cuda:0": {"allocated_bytes": 6 * GiB}})]
    assert f"   • cuda:0 allocated: 6.0 GiB at {clock(T0 + 1)}" in format_report(samples, [])


def test_no_samples_is_one_line_never_an_exception():
    report = format_report([], [])
    assert report == ("MEMPROF-OTEL MEMORY REPORT: no samples yet "
                      "(start monitoring, run some work, then ask again)")
    assert "\n" not in format_report([], [op(1, "load", 0, None, 0, None)], title="X")


def test_no_operations_and_unreadable_rss():
    samples = [Sample(T0, {}), Sample(T0 + 2, {"resident_memory_bytes": float("nan")})]
    report = format_report(samples, [])
    assert "   • RSS (Physical): 0 B at" in report
    assert "Operations Timeline: none recorded" in report
    assert "   • Peak during:    (no operation)" in report


def test_custom_title_and_signed_bytes():
    assert format_report([sample(0, MiB)], [], title="T").splitlines()[:2] == ["T", "=" * 60]
    assert [signed_bytes(1536), signed_bytes(-1536), signed_bytes(0)] == ["+1.5 KiB", "-1.5 KiB", "+0 B"]


def test_public_report_and_plot_stay_functions_after_first_call():
    code = ("import memprof_otel as mp; mp.report(); import memprof_otel.reports.plot, memprof_otel.reports.text; "
            "assert callable(mp.report) and callable(mp.plot), (mp.report, mp.plot)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_a_chain_of_thousands_of_nested_operations_is_ordered_without_recursion():
    n = 5000  # a leaked operation makes every later one its child: chains this deep happen
    chain = [op(i, f"op{i}", i, i + 0.5, 0, 0, kind="operation", parent_id=i - 1 if i > 1 else None)
             for i in range(1, n + 1)]
    sibling = op(n + 1, "sibling", 2.2, 3, 0, 0, kind="operation", parent_id=1)  # op1's second child
    ordered = ordered_operations([*reversed(chain), sibling])
    assert [(d, o.id) for d, o in ordered][:3] == [(0, 1), (1, 2), (2, 3)]
    assert ordered[-1] == (1, sibling)  # after op2's whole subtree, as a recursive walk put it
    assert len(ordered) == n + 1 and ordered[n - 1] == (n - 1, chain[-1])
    samples = [sample(0, GiB), sample(1, 2 * GiB)]
    assert "op1" in format_report(samples, chain)  # the report itself renders too
