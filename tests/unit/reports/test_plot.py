import math
import os
import random
import threading
from pathlib import Path

import pytest

from memprof_otel.errors import MemprofError
from memprof_otel.timeline import OperationRecord, Sample, Timeline
from memprof_otel.errors import ExportError

pytest.importorskip("matplotlib", reason="plots extra not installed")

from memprof_otel.reports.plot import build_figure, byte_unit, io_per_operation, plot_timeline  # noqa: E402

GiB = 1024**3
MiB = 1024**2
T0 = 1_700_000_000.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def three_phase_timeline() -> Timeline:
    """load 0-10 s reads 2 GiB, compile 10-30 s peaks at 3 GiB and writes 100 MiB, generate
    30-40 s (still open); one sample a second."""
    samples = []
    for i in range(41):
        rss = 0.5 * GiB + i * 0.1 * GiB if i <= 10 else (1.5 + 1.5 * (i - 10) / 10) * GiB if i <= 20 \
            else (3.0 - 0.1 * (i - 20)) * GiB if i <= 30 else 2.0 * GiB + (i - 30) * 0.05 * GiB
        read = min(i, 10) * 0.2 * GiB
        write = max(0, min(i, 30) - 10) * 5 * MiB
        samples.append(Sample(T0 + i, {"resident_memory_bytes": rss, "cpu_utilization_ratio": 0.3 + 0.015 * i,
                                       "io_read_bytes": read, "io_write_bytes": write},
                              {"cpu": {"allocated_bytes": rss * 0.6}}))
    ops = [OperationRecord(1, "load", "phase", T0, int(0.5 * GiB), end=T0 + 10, rss_end=int(1.5 * GiB)),
           OperationRecord(2, "compile", "phase", T0 + 10, int(1.5 * GiB), end=T0 + 30, rss_end=2 * GiB),
           OperationRecord(3, "generate", "phase", T0 + 30, 2 * GiB)]
    return Timeline.from_samples(samples, ops)


def realistic_timeline(seed: int = 7) -> Timeline:
    """An LLM-ish run: load weights (disk reads, RSS to ~9 GiB, weights moved to cuda:0), compile
    (RSS peaks ~19 GiB, writes a cache), generate (KV cache grows on cuda:0). 2 samples a second."""
    rnd = random.Random(seed)
    phases = [("load", 0.0, 25.2), ("compile", 25.2, 146.0), ("generate", 146.0, 185.3)]
    samples, read, write = [], 0.0, 0.0
    t, dt = 0.0, 0.5
    while t <= 185.3:
        if t < 25.2:
            f = t / 25.2
            rss, cuda = (0.6 + 8.2 * f) * GiB, (7.4 * max(0.0, f - 0.55) / 0.45) * GiB
            cpu, read = 0.35 + 0.1 * rnd.random(), read + dt * 0.68 * GiB
        elif t < 146.0:
            f = (t - 25.2) / 120.8
            rise = 9.9 * math.sin(math.pi * min(1.0, f * 1.15) / 2)   # builds up, then plateaus
            rss = (8.8 + rise - 4.2 * max(0.0, f - 0.87) / 0.13) * GiB  # frees graphs at the end
            cuda = 7.4 * GiB + 0.6 * GiB * f
            cpu, write = 0.82 + 0.15 * rnd.random(), write + dt * 18 * MiB
        else:
            f = (t - 146.0) / 39.3
            rss, cuda = (14.5 + 0.6 * f) * GiB, (8.0 + 3.6 * f + 0.4 * math.sin(t)) * GiB
            cpu, read = 0.45 + 0.2 * rnd.random(), read + dt * 2 * MiB
        rss += rnd.uniform(-0.08, 0.08) * GiB
        samples.append(Sample(T0 + t, {"resident_memory_bytes": rss, "cpu_utilization_ratio": cpu,
                                       "io_read_bytes": read, "io_write_bytes": write},
                              {"cpu": {"allocated_bytes": rss * 0.82}, "cuda:0": {"allocated_bytes": cuda}}))
        t = round(t + dt, 6)
    rss_at = {round(s.t - T0, 1): s.rss for s in samples}
    ops = [OperationRecord(i + 1, name, "phase", T0 + a, rss_at.get(round(a * 2) / 2, 0), end=T0 + b,
                           rss_end=rss_at.get(round(b * 2) / 2, samples[-1].rss))
           for i, (name, a, b) in enumerate(phases)]
    return Timeline.from_samples(samples, ops)


def assert_png(path: Path, size=(1600, 1000)) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    from matplotlib.image import imread
    img = imread(path)
    assert (img.shape[1], img.shape[0]) == size


def test_io_per_operation_differences_counters_over_each_operation():
    # load reads 0.2 GiB/s for 10 s; compile writes 5 MiB/s for 20 s; generate is open (to 40 s)
    assert io_per_operation(three_phase_timeline()) == [
        ("load", 2 * GiB, 0), ("compile", 0, 100 * MiB), ("generate", 0, 0)]


def test_io_per_operation_interpolates_between_samples_and_clamps():
    tl = Timeline(timestamps=[T0, T0 + 10], rss_bytes=[0, 0], cpu_ratio=[0, 0],
                  io_read_bytes=[1000, 2000], io_write_bytes=[500, 100],  # write counter went back
                  allocated={}, operations=[
                      OperationRecord(1, "a", "operation", T0 + 2.5, 0, end=T0 + 7.5),
                      OperationRecord(2, "before", "operation", T0 - 5, 0, end=T0 + 5),
                      OperationRecord(3, "open", "operation", T0 + 5, 0)])
    assert io_per_operation(tl) == [("a", 500, 0), ("before", 500, 0), ("open", 500, 0)]
    empty = Timeline([], [], [], [], [], {}, [OperationRecord(1, "x", "phase", T0, 0)])
    assert io_per_operation(empty) == [("x", 0, 0)]


def test_byte_unit_picks_by_magnitude():
    assert byte_unit(3 * GiB) == ("GiB", GiB)
    assert byte_unit(900 * MiB) == ("MiB", MiB)
    assert byte_unit(0) == ("B", 1)


def test_plot_three_phase_run_writes_a_1600x1000_png(tmp_path):
    out = tmp_path / "profile.png"
    plot_timeline(three_phase_timeline(), out)
    assert_png(out)
    assert [p.name for p in tmp_path.iterdir()] == ["profile.png"]  # no temp file left behind
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_plot_realistic_run_with_nested_and_open_operations(tmp_path):
    tl = realistic_timeline()
    ops = tl.operations + [
        OperationRecord(10, "torch.compile", "operation", T0 + 30, 0, parent_id=2, end=T0 + 90, rss_end=GiB),
        OperationRecord(11, "request", "operation", T0 + 150, 0, parent_id=3)]
    plot_timeline(Timeline(tl.timestamps, tl.rss_bytes, tl.cpu_ratio, tl.io_read_bytes, tl.io_write_bytes,
                           tl.allocated, sorted(ops, key=lambda o: o.start)), tmp_path / "p.png")
    assert_png(tmp_path / "p.png")


def test_plot_empty_timeline_and_no_operations_still_make_a_png(tmp_path):
    plot_timeline(Timeline.from_samples([]), tmp_path / "empty.png")
    assert_png(tmp_path / "empty.png")
    tl = three_phase_timeline()
    plot_timeline(Timeline(tl.timestamps, tl.rss_bytes, tl.cpu_ratio, tl.io_read_bytes, tl.io_write_bytes,
                           tl.allocated, []), tmp_path / "noops.png")
    assert_png(tmp_path / "noops.png")
    one = Timeline.from_samples([Sample(T0, {"resident_memory_bytes": 0.0})])
    plot_timeline(one, tmp_path / "one.png")
    assert_png(tmp_path / "one.png")


def test_many_operations_are_capped_in_the_bar_panels(tmp_path):
    samples = [Sample(T0 + i, {"resident_memory_bytes": float(MiB * (i + 1))}) for i in range(60)]
    ops = [OperationRecord(i, f"step{i}", "operation", T0 + i, 0, end=T0 + i + 1) for i in range(50)]
    plot_timeline(Timeline.from_samples(samples, ops), tmp_path / "many.png")
    assert_png(tmp_path / "many.png")


def test_plots_from_threads_do_not_interfere(tmp_path):
    tl = three_phase_timeline()
    errors = []

    def run(i):
        try:
            plot_timeline(tl, tmp_path / f"t{i}.png")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len({(tmp_path / f"t{i}.png").read_bytes() for i in range(4)}) == 1


def test_unwritable_path_raises_export_error_with_the_path(tmp_path):
    with pytest.raises(ExportError, match="cannot write .*nope.*profile.png"):
        plot_timeline(three_phase_timeline(), tmp_path / "nope" / "profile.png")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(ExportError):
                plot_timeline(three_phase_timeline(), ro / "x.png")
        finally:
            ro.chmod(0o700)


def test_missing_matplotlib_raises_memprof_error(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MemprofError, match=r"pip install 'memprof-otel\[plots\]'"):
        build_figure(three_phase_timeline())


def test_check_image_for_people(tmp_path):
    """Also writes the review copy at /tmp/memprof_plot_check.png (looked at by hand)."""
    out = Path(os.environ.get("MEMPROF_PLOT_CHECK", tmp_path / "check.png"))
    plot_timeline(realistic_timeline(), out)
    assert_png(out)
