"""The black box service: this process's file, kept current, and the post-mortems of the
processes that left theirs behind.

The composition root hands it the sampler's ticks (``on_sample``), every instrumented model's
forward openings and closings (``opened``/``closed``, the ``FlightListener`` of
``attribution/handle.py``), and asks it for its series rows and its post-mortems. ``start``
opens the file, notes the stop signals the process handles (``signals.py``) and, once per
process, scans the folder for dead processes' files on a background thread, filing their
post-mortems in the service's history (``history.py``), which every process of the service serves;
``shutdown`` marks the process clean and removes its file.

The forward path is a dictionary lookup, a clock read and a copy into the mapping under a lock
(and, for a forward that starts with none other in flight, one read of the resident size: the
level between forwards the cause of an OOM kill is measured from); the layer a forward is in is
written on each sampler tick and at each near-limit notification (which a waiting thread
receives from the kernel, so the last milliseconds before an OOM kill say where the forward was).
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import tempfile
import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import DEFAULT_SERVICE_NAME, BlackboxConfig
from ..sources.process import ProcessSource
from ..timeline import Sample
from . import kernel, signals
from .classify import REASONS, STOPPED, KernelView, classify, ended_unix
from .oom_figures import cause_of
from .format import FILE_SUFFIX, FLIGHT_SLOT, PAYLOAD_VERSION, SLOT_HEAD, Contents, Layout, dumps, samples_for
from .history import History, folder_name
from .scan import SKIP_REASONS, scan
from .writer import Writer

log = logging.getLogger("memprof_otel")

MAX_POSTMORTEMS = 64        # filed by this process, kept in memory for the advice and when the history cannot be written
_SHAPE_CACHE = 1024         # (model, root, features, operation) payloads kept pre-encoded


def service_key(service_name: str, argv: list[str] | None = None, cwd: str | None = None) -> str:
    """What tells this service's black boxes and post-mortems from another's: its name where one was
    given; for a service left unnamed (``memprof-otel``), the name and a digest of the working
    directory and the whole command line (program path and every argument): the workers of a
    server (gunicorn's forks, uvicorn's and LitServe's spawned workers, torchrun's ranks get their
    parent's) and its restarts share it; another command, or the same one with other options
    (``--port=8001`` and ``--port=8002``), does not."""
    if service_name != DEFAULT_SERVICE_NAME:
        return service_name
    args = list(sys.argv if argv is None else argv)
    try:
        where = os.getcwd() if cwd is None else cwd
    except OSError:
        where = ""
    digest = hashlib.sha256("\0".join([where, *args]).encode("utf-8", "replace")).hexdigest()[:10]
    return f"{service_name}-{digest}"


def default_dir(service_key: str, base: str | None = None) -> Path:
    """``<temp dir>/memprof-otel-blackbox-<service key>``: per service, not per process, so the
    next process of the service finds what the last one left."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in service_key)[:60] or "memprof-otel"
    return Path(base if base is not None else tempfile.gettempdir()) / f"memprof-otel-blackbox-{safe}"


def _usable_dir(folder: Path, private: bool) -> str | None:
    """Why ``folder`` cannot hold black boxes (None: it can). Created 0700 when missing. The
    default folder has a predictable name in a shared temp dir: it must be this user's, no link,
    closed to group and others."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        return f"cannot create {folder}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if private and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
        return (f"{folder} is not a private folder of this user (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):o}); remove it or set blackbox.dir")
    return None


def _sample_body(s: Sample, extra: Mapping[str, Any]) -> bytes:
    d = s.to_dict()
    d.update(extra)
    body = dumps(d)
    if len(body) > 1900:  # many GPUs or MIG slices: their figures go first, the memory figures stay
        d.pop("gpus", None)
        body = dumps(d)
    if len(body) > 1900:
        d = {"t": s.t, "process": dict(s.process), "container": dict(s.container), **extra}
        body = dumps(d)
    return body


def postmortem(c: Contents, reason: str, evidence: list[str]) -> dict[str, Any]:
    """The ``/v1/postmortem`` entry of one dead process (pure)."""
    ident = c.identity
    limit = next((s["limit_bytes"] for s in reversed(c.samples) if isinstance(s.get("limit_bytes"), int)), None)
    near = c.state.get("near_limit")
    return {"pid": ident.get("pid"), "reason": reason, "evidence": evidence, "ended_unix": ended_unix(c),
            "started_unix": ident.get("started_unix"), "service": ident.get("service"),
            "host": ident.get("host"), "limit_bytes": limit,
            "near_limit": near if isinstance(near, dict) else None,
            "in_flight": [{"model": f.get("model"), "features": f.get("features") or {}, "layer": f.get("layer", ""),
                           "operation": f.get("operation"), "started_unix": f.get("started_unix"),
                           "limit_reached": bool(f.get("limit_reached")),
                           **({"start_resident_bytes": f["start_resident_bytes"]} if "start_resident_bytes" in f else {}),
                           **{k: f[k] for k in _PREDICTION if k in f}} for f in c.flight],
            "samples": c.samples, "torn_slots": c.torn,
            "cause": cause_of(c, reason, limit).to_dict(),
            "sampler_interval_seconds": ident.get("interval"), "window_seconds": ident.get("window")}


# what the black box writes beside a forward in flight from payload version 2 on: its predicted peak
# and largest safe batch, for the cause of an OOM kill (``oom_figures.py``)
_PREDICTION = ("device", "unit", "predicted_peak_bytes", "max_safe_batch")
_FLIGHT_BODY_MAX = FLIGHT_SLOT - SLOT_HEAD.size


class _Flight:
    __slots__ = ("model", "root", "features", "operation", "started", "state", "layer", "limit_reached", "written",
                 "prediction", "predicted_written", "start_resident")

    def __init__(self, model: str, root: str, features: Mapping[str, int] | None, operation: str | None,
                 started: float, state: Any, start_resident: int | None = None) -> None:
        self.model, self.root, self.features, self.operation = model, root, features, operation
        self.started, self.state, self.layer, self.limit_reached = started, state, root, False
        self.start_resident = start_resident  # the resident size at its start, when no forward was in flight
        self.written = False  # its start time is in the file (the first tick writes it)
        self.prediction: dict[str, Any] | None = None  # asked once, on a tick, outside the lock
        self.predicted_written = False

    def innermost(self) -> str:
        """The deepest layer this attributed forward is in now (its root when not attributed)."""
        tracker = getattr(self.state, "tracker", None) if self.state is not None else None
        try:
            inner = tracker.innermost() if tracker is not None else None
        except Exception:  # read from another thread: a frame popped meanwhile
            inner = None
        return inner if isinstance(inner, str) else self.root

    def body(self) -> bytes:
        d = {"started_unix": self.started, "model": self.model, "features": dict(self.features or {}),
             "layer": self.layer, "operation": self.operation, "limit_reached": self.limit_reached}
        if self.start_resident is not None:
            d["start_resident_bytes"] = self.start_resident
        if self.prediction:
            body = dumps({**d, **{k: self.prediction[k] for k in _PREDICTION if k in self.prediction}})
            if len(body) <= _FLIGHT_BODY_MAX:  # a long layer path and model name keep the slot
                return body
        return dumps(d)


class BlackBox:
    """``store_json(doc, kind, model)`` stores a dump; ``operation()`` names the operation the
    calling thread is in; ``on_postmortem(doc)`` tells the exporters (an OTel log record);
    ``predict(model, features)`` a forward's predicted peak and safe batch (``_PREDICTION`` keys);
    ``leak()`` the leak detector's suspect on the host now, if any (written with each tick)."""

    def __init__(self, store_json: Callable[[dict[str, Any], str, str], Any],
                 operation: Callable[[], str | None],
                 on_postmortem: Callable[[dict[str, Any]], None] = lambda doc: None,
                 predict: Callable[[str, Mapping[str, int]], Mapping[str, Any]] = lambda model, features: {},
                 leak: Callable[[], Mapping[str, Any] | None] = lambda: None) -> None:
        self._store_json = store_json
        self._leak = leak
        self._operation = operation
        self._predict = predict
        self._on_postmortem = on_postmortem
        self._lock = threading.Lock()
        self._writer: Writer | None = None
        self._flight: list[_Flight | None] = []
        self._free: list[int] = []
        self._cache: dict[tuple[Any, ...], bytes] = {}
        self._state: dict[str, Any] = {}
        self._watch: kernel.LimitWatch | None = None
        self._cg: kernel.MemoryCgroup | None = None
        self._key: tuple[Any, ...] | None = None
        self._scanned_pid: int | None = None
        self._scan_done = threading.Event()
        self._scan_done.set()
        self._process: ProcessSource | None = None  # the resident size at a forward's start: one statm pread
        self._history: History | None = None
        self._history_error: str | None = None
        self._pending_signal: dict[str, Any] | None = None
        self._pending_done: tuple[int, float] | None = None
        self.folder: Path | None = None
        self.service_key: str | None = None
        self.disabled_reason: str | None = "not started"
        self.graceful_stops = 0  # files of processes that stopped gracefully, removed without a post-mortem
        self.postmortems: list[dict[str, Any]] = []  # filed by this process (its advice cites the latest)
        self._unfiled: list[dict[str, Any]] = []     # of those, the ones the history could not take
        self.counts: Counter[str] = Counter(dict.fromkeys(REASONS, 0))
        self.skipped: Counter[str] = Counter(dict.fromkeys(SKIP_REASONS, 0))
        self.flight_overflow = 0
        self._pid = os.getpid()
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)  # a black box built by a test and dropped is not kept alive
            os.register_at_fork(after_in_child=lambda: (b := ref()) is not None and b._after_fork())

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, cfg: BlackboxConfig, service_name: str, interval_s: float) -> None:
        """Open this process's file (again when the settings changed) and scan the folder once."""
        try:
            self._start(cfg, service_name, interval_s)
        except Exception as e:  # the black box never stops monitoring, nor the model
            self.disabled_reason = f"{type(e).__name__}: {e}"
            log.warning("memprof_otel: the black box is off: %s", self.disabled_reason)

    def _start(self, cfg: BlackboxConfig, service_name: str, interval_s: float) -> None:
        key = (cfg, service_name, interval_s)
        if key == self._key and self._writer is not None and not self._writer.closed:
            return
        self._close(remove=True)
        self._key = key
        if not cfg.enabled:
            self.disabled_reason = "blackbox.enabled is false"
            return
        key = service_key(service_name)
        folder = Path(cfg.dir) if cfg.dir else default_dir(key)
        why = _usable_dir(folder, private=not cfg.dir)
        if why is not None:
            self.disabled_reason = why
            log.warning("memprof_otel: the black box is off: %s", why)
            return
        self.folder = folder
        self.service_key = key
        try:
            self._history = History(str(folder / folder_name(key)), cfg.keep, cfg.keep_for)
            self._history_error = None
        except OSError as e:  # post-mortems are then kept in this process only
            self._history, self._history_error = None, f"cannot keep the history: {e.strerror or e}"
            log.warning("memprof_otel: black box %s", self._history_error)
        pid = os.getpid()
        self._pid = pid
        ticks = kernel.start_ticks()
        self._cg = kernel.memory_cgroup()
        layout = Layout(samples_for(cfg.window, interval_s))
        identity = {"pid": pid, "start_ticks": ticks, "uid": os.geteuid(), "service": service_name, "service_key": key,
                    "host": os.uname().nodename, "started_unix": time.time(), "interval": interval_s,
                    "window": cfg.window, "payload_version": PAYLOAD_VERSION,
                    "cgroup": self._cg.path if self._cg is not None else None,
                    "cgroup_version": self._cg.version if self._cg is not None else None}
        name = f"{pid}-{ticks or 0}{FILE_SUFFIX}"
        path = str(folder / name)
        try:
            os.unlink(path)  # our own, from a start before a restart of monitoring
        except FileNotFoundError:
            pass
        with self._lock:
            self._writer = Writer(path, layout, identity)
            self._flight = [None] * layout.n_flight
            self._free = list(range(layout.n_flight - 1, -1, -1))
            self._state = {}
            self._writer.write_state(self._state)
        self.disabled_reason = None
        if self._process is None:  # its own (this layer does not reach the sources registry, which loads torch)
            self._process = ProcessSource()
        signals.install(self._note_signal, self._note_restored)
        self._arm_watch()
        if self._scanned_pid != pid:
            self._scanned_pid = pid
            self._scan_done.clear()
            threading.Thread(target=self._scan, args=(str(folder), name), name="memprof-blackbox-scan",
                             daemon=True).start()

    def _arm_watch(self) -> None:
        cg = self._cg
        if cg is None:
            return
        limit = kernel.counters(cg).get("limit_bytes")
        if limit is None:
            return
        watch = kernel.LimitWatch(cg, limit, self._limit_event)
        if watch.start():
            self._watch = watch

    def _after_fork(self) -> None:
        """A forked child: the parent's file and threads are not its own. It opens its own file at
        its next sampler tick (and scans: a sibling may have been killed)."""
        w, self._writer = self._writer, None
        if w is not None:
            w.abandon()
        self._lock = threading.Lock()
        self._watch = None  # the thread did not come along; the fds are the parent's watch's
        self._flight, self._free = [], []
        self._scan_done = threading.Event()
        self._scan_done.set()
        self._pending_signal = self._pending_done = None
        self.postmortems = []
        self._unfiled = []
        self.counts = Counter(dict.fromkeys(REASONS, 0))
        self.skipped = Counter(dict.fromkeys(SKIP_REASONS, 0))

    def mark_exiting(self) -> None:
        """The interpreter began its exit (atexit): if the clean shutdown never comes, the reason is
        ``exited``."""
        with self._lock:
            if self._writer is not None:
                self._state["exiting"] = True
                self._state["exiting_unix"] = time.time()
                self._writer.write_state(self._state)

    def shutdown(self) -> None:
        """A clean end: the file is removed (a clean shutdown leaves none)."""
        self._close(remove=True)
        self._key = None

    def _close(self, remove: bool) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        with self._lock:
            w, self._writer = self._writer, None
            if w is not None:
                if remove:
                    self._state["clean"] = True
                    w.write_state(self._state)
                w.close(remove)
            self._flight, self._free = [], []

    # ---- the forward path (FlightListener) -----------------------------------------------------
    def opened(self, model: str, root: str, features: Mapping[str, int] | None, state: Any) -> int:
        """A forward of ``model`` opened at ``root``; the slot it holds (-1: none). No lock: the
        slot is taken with an atomic ``list.pop`` and the bytes, made once per (model, root, shape,
        operation), go in with one copy (the GIL holds through it: no other thread's write interleaves)."""
        w = self._writer
        if w is None:
            return -1
        idle = len(self._free) == len(self._flight)  # no forward in flight: the level now is between forwards
        try:
            idx = self._free.pop()
        except IndexError:
            self.flight_overflow += 1
            return -1
        op = self._operation()
        key = (model, root, tuple(features.items()) if features else None, op)
        slot = self._cache.get(key)
        if slot is None:
            body = dumps({"model": model, "features": dict(features or {}), "layer": root, "operation": op})
            slot = Writer.slot_bytes(body, 1)
            if len(self._cache) >= _SHAPE_CACHE:
                self._cache.clear()
            self._cache[key] = slot
        proc = self._process
        self._flight[idx] = _Flight(model, root, features, op, time.time(), state,
                                    proc.resident_now() if idle and proc is not None else None)
        w.open_flight(idx, slot)
        return idx

    def closed(self, token: int) -> None:
        if token < 0:
            return
        with self._lock:  # against a tick's or a notification's update of this slot
            w = self._writer
            if w is None or token >= len(self._flight) or self._flight[token] is None:
                return
            self._flight[token] = None
            w.clear_flight(token)
            self._free.append(token)
            self._write_pending()  # a stop signal that arrived while this held the lock

    def _refresh_flight(self, limit_reached: bool = False) -> None:
        """Write the layer each forward is in now (under the lock)."""
        w = self._writer
        if w is None:
            return
        for idx, f in enumerate(self._flight):
            if f is None:
                continue
            layer = f.innermost()
            predicted = bool(f.prediction) and not f.predicted_written
            if not f.written or layer != f.layer or (limit_reached and not f.limit_reached) or predicted:
                f.layer = layer
                f.limit_reached = f.limit_reached or limit_reached
                f.written = w.update_flight(idx, f.body())
                f.predicted_written = f.written and bool(f.prediction)

    def _predict_flights(self) -> None:
        """Ask each forward in flight for its predicted peak once, on the sampler's thread and outside
        the lock (the forward path's ``closed`` takes it; a budget read may touch the device)."""
        for f in list(self._flight):
            if f is None or f.prediction is not None:
                continue
            if not f.features:
                f.prediction = {}
                continue
            try:
                f.prediction = dict(self._predict(f.model, f.features))
            except Exception as e:  # a prediction is an extra: the record goes on without it
                f.prediction = {}
                log.debug("memprof_otel: black box prediction failed: %r", e)

    # ---- the sampler's tick and the kernel's notifications ---------------------------------------
    def on_sample(self, s: Sample) -> None:
        if self._writer is None:
            if self._key is not None and os.getpid() != self._pid:  # a forked child's first tick
                cfg, service, interval = self._key
                self._key = None
                self.start(cfg, service, interval)
            if self._writer is None:
                return
        extra: dict[str, Any] = dict(kernel.counters(self._cg))
        if "limit_bytes" not in extra and "memory_limit_bytes" in s.process:
            extra["limit_bytes"] = int(s.process["memory_limit_bytes"])
        try:
            leak = self._leak()
        except Exception:  # a suspect is an extra: the tick is written without it
            leak = None
        if leak:
            extra["leak"] = dict(leak)
        extra["busy"] = len(self._flight) - len(self._free)  # forwards in flight: 0 = a level between forwards
        body = _sample_body(s, extra)
        self._predict_flights()
        with self._lock:
            w = self._writer
            if w is not None:
                w.write_sample(body)
                self._refresh_flight()
                self._write_pending()

    def _note_signal(self, signum: int) -> None:
        """A stop signal reached a Python handler (the server's), noted before that handler runs.
        This runs on the main thread between two bytecodes of whatever it was running, which may
        hold the lock (a forward's ``closed``): then the note is left pending, and whoever holds the
        lock writes it before letting go (``closed``, a tick, a notification); it never waits for
        the lock long (another thread's hold is a copy or two)."""
        self._pending_signal = {"signum": int(signum), "name": signals.name(signum), "t": time.time()}
        self._write_pending_soon()

    def _note_restored(self, signum: int) -> None:
        """A handler of a stop signal noted before was set again: the server's shutdown ended (uvicorn
        restores the handlers it found, then re-raises the signal). It may be set from inside a
        signal handler, so the lock is waited for as briefly as in ``_note_signal``."""
        self._pending_done = (signum, time.time())
        self._write_pending_soon()

    def _write_pending_soon(self) -> None:
        """The pending notes written now if the lock is had within 50 ms; else by its holder."""
        if self._lock.acquire(timeout=0.05):
            try:
                self._write_pending()
            finally:
                self._lock.release()

    def _merge_pending(self) -> bool:
        """The pending stop-signal notes into the state (under the lock); whether there were any."""
        note, self._pending_signal = self._pending_signal, None
        done, self._pending_done = self._pending_done, None
        if note is not None:
            self._state["stop_signal"] = note
        current = self._state.get("stop_signal")
        if done is not None and isinstance(current, dict) and current.get("signum") == done[0]:
            current["shutdown_done_unix"] = done[1]
        return note is not None or done is not None

    def _write_pending(self) -> None:
        """(under the lock) Any pending notes merged and written; nothing when there are none."""
        if self._pending_signal is None and self._pending_done is None:
            return
        if self._merge_pending() and self._writer is not None:
            self._writer.write_state(self._state)

    def _limit_event(self, kind: str, usage: int | None) -> None:
        now = time.time()
        with self._lock:
            if self._writer is None:
                return
            if kind == "oom":
                self._state["oom_event"] = {"t": now, "usage_bytes": usage}
                self._refresh_flight(limit_reached=True)
            else:
                watch = self._watch
                threshold = watch.threshold if watch is not None else None
                above = usage is not None and threshold is not None and usage >= threshold
                self._state["near_limit"] = {"t": now, "usage_bytes": usage, "threshold_bytes": threshold,
                                             "above": above}
                self._refresh_flight(limit_reached=above)
            self._merge_pending()  # written with the event, in one write
            self._writer.write_state(self._state)

    # ---- the post-mortems ------------------------------------------------------------------------
    def _scan(self, folder: str, own: str) -> None:
        try:
            if self._history is not None:
                self._history.prune()
            result = scan(folder, own, kernel.alive, claim_suffix=f".claimed-{os.getpid()}",
                          service_key=self.service_key)
            self.skipped.update(result.skipped)
            if result.found:
                self._report(result.found)
        except Exception as e:
            log.warning("memprof_otel: black box scan of %s failed: %r", folder, e)
        finally:
            self._scan_done.set()

    def _report(self, found: list[tuple[str, Contents]]) -> None:
        earliest = min((c.identity.get("start_ticks") or 0) for _, c in found)
        killed = kernel.kernel_log_oom_kills(earliest / kernel.clock_ticks())
        for _, c in sorted(found, key=lambda x: ended_unix(x[1]) or 0.0):
            ident = c.identity
            cg_path, version = ident.get("cgroup"), ident.get("cgroup_version")
            now = kernel.oom_kills_at(cg_path, int(version)) if isinstance(cg_path, str) and version in (1, 2) else None
            view = KernelView(now, None if killed is None else int(ident["pid"]) in killed)
            reason, evidence = classify(c, view)
            if reason == STOPPED:  # a graceful stop: its file goes, and no post-mortem is filed
                self.graceful_stops += 1
                log.info("memprof_otel: process %s (%s) stopped gracefully (%s handled, nothing in flight)",
                         ident.get("pid"), ident.get("service"), (c.state.get("stop_signal") or {}).get("name"))
                continue
            doc = postmortem(c, reason, evidence)
            models = sorted({f["model"] for f in doc["in_flight"] if isinstance(f.get("model"), str)})
            info = self._store_json(doc, "postmortem", models[0] if len(models) == 1 else "")
            if info is not None:
                doc["dump_id"] = getattr(info, "id", None)
            self.counts[reason] += 1
            self._file(doc)
            log.warning("memprof_otel: process %s (%s) ended without a clean shutdown: %s (evidence: %s); "
                        "GET /v1/postmortem", doc["pid"], ident.get("service"), reason, ", ".join(evidence))
            try:
                self._on_postmortem(doc)
            except Exception as e:
                log.debug("memprof_otel: post-mortem export failed: %r", e)

    def _file(self, doc: dict[str, Any]) -> None:
        """Into the service's history (every process serves it from there); kept here when it cannot be."""
        self.postmortems.append(doc)
        del self.postmortems[:-MAX_POSTMORTEMS]
        try:
            if self._history is None:
                raise OSError(self._history_error or "no history")
            self._history.add(doc)
        except OSError as e:  # a full disk, a folder removed: this process still serves it
            self._unfiled.append(doc)
            del self._unfiled[:-MAX_POSTMORTEMS]
            log.warning("memprof_otel: post-mortem of process %s not kept in the history: %r", doc.get("pid"), e)

    def records(self) -> list[dict[str, Any]]:
        """The service's post-mortems, newest first: the history's (every process's), with those this
        process could not file there."""
        kept = self._history.records() if self._history is not None else []
        docs = kept + [d for d in self._unfiled if d not in kept]
        return sorted(docs, key=lambda d: d.get("ended_unix") or 0.0, reverse=True)

    def last_cause(self) -> dict[str, Any] | None:
        """The cause of the latest OOM kill among the post-mortems, with when and where (the advice
        cites it); None when none was OOM-killed."""
        killed = [d for d in self.records() if d.get("reason") == "oom_kill" and d.get("cause")]
        if not killed:
            return None
        doc = max(killed, key=lambda d: d.get("ended_unix") or 0.0)
        models = sorted({f["model"] for f in doc["in_flight"] if isinstance(f.get("model"), str)})
        return {"source": "postmortem", "time": doc.get("ended_unix"), "pid": doc.get("pid"),
                "model": models[0] if models else "", "device": "cpu", "dump_id": doc.get("dump_id"),
                **doc["cause"]}

    def document(self, wait_s: float = 5.0) -> dict[str, Any]:
        """The ``GET /v1/postmortem`` document (waits up to ``wait_s`` for a scan under way)."""
        self._scan_done.wait(wait_s)
        h = self._history
        return {"postmortems": self.records(), "skipped_files": dict(self.skipped),
                "graceful_stops": self.graceful_stops, "scanning": not self._scan_done.is_set(),
                "dir": str(self.folder) if self.folder is not None else None,
                "service_key": self.service_key,
                "history": {"dir": h.folder, "keep": h.keep, "keep_seconds": h.keep_seconds} if h is not None
                else {"dir": None, "error": self._history_error},
                "recording": self._writer is not None, "disabled_reason": self.disabled_reason}

    def totals(self) -> Counter[str]:
        """The service's deaths per reason: the history's count (every process reads the same), with
        those this process could not file there; every reason, 0 included."""
        out = Counter(dict.fromkeys(REASONS, 0))
        if self._history is not None:
            out.update(self._history.counts())
        out.update(Counter(str(d.get("reason")) for d in self._unfiled))
        return out

    def source_status(self) -> dict[str, Any] | None:
        """This black box as a source of ``/v1/status`` (None when switched off by its setting)."""
        if self._key is None or not self._key[0].enabled:
            return None
        up = self._writer is not None
        return {"up": up, "errors": 0 if up else 1, "last_error": None if up else self.disabled_reason}

    def series(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        # every reason, 0 included; the fleet set leaves the zeros out (export/fleet_families.py).
        # The count is the service's, the same in every worker: a merged exposition keeps one copy
        # (export/exposition_merge.py SERVICE_WIDE)
        out: dict[str, list[tuple[dict[str, str], float]]] = {
            "memprof_postmortems_total": [({"reason": r}, float(n)) for r, n in sorted(self.totals().items())]}
        status = self.source_status()  # None: switched off by its setting, no series to alert on
        if status is not None:
            out["memprof_source_up"] = [({"source": "blackbox"}, 1.0 if status["up"] else 0.0)]
        return out


def span_attributes(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A post-mortem as OTel event attributes (scalars only), for an OTLP-only deployment."""
    flight = doc.get("in_flight") or []
    first = flight[0] if flight else {}
    return {"memprof.postmortem.pid": doc.get("pid") or 0, "memprof.postmortem.reason": doc.get("reason") or "",
            "memprof.postmortem.evidence": ",".join(doc.get("evidence") or ()),
            "memprof.postmortem.ended_unix": doc.get("ended_unix") or 0.0,
            "memprof.postmortem.limit_bytes": doc.get("limit_bytes") or 0,
            "memprof.postmortem.in_flight": len(flight),
            "memprof.model": str(first.get("model") or ""), "memprof.layer": str(first.get("layer") or ""),
            "memprof.postmortem.features": dumps(first.get("features") or {}).decode(),
            "memprof.postmortem.dump_id": str(doc.get("dump_id") or ""),
            "memprof.postmortem.cause": str((doc.get("cause") or {}).get("cause") or ""),
            "memprof.postmortem.knob": str((doc.get("cause") or {}).get("knob") or "")}
