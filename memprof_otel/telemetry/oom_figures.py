"""The figures an OOM's cause is decided from (``oom/cause.py``), gathered where an OOM is seen.
(The same figures of a process the kernel killed come from its file alone: ``blackbox/oom_figures.py``.)

``OomExplainer`` is what the OOM recorder (``dumps/oom_recorder.py``) asks when a forward raised
out-of-memory: the limit in force and what was held (the capacity model's budget), the request's
shape, predicted peak and largest safe batch (its memory model), the allocator's state at the
failure (read back from torch's CUDA message: no reading taken after the unwinding can give it),
memory outside the allocator now and at the start of the samples held, and the leak detector's
suspect on the device. ``flight_prediction`` is what the black box writes beside each forward in
flight, so a process the kernel kills leaves its request's predicted peak and safe batch behind, and
``host_leak`` the leak suspect it writes with each tick.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..attribution.handle import ModelHandle
from ..oom.cause import LeakTrend, OomFigures, classify
from ..oom.cuda_message import parse as parse_cuda_message
from ..timeline import Sample
from .leaks import ALLOCATOR, LAYER, PROCESS, LeakWatch
from .started import CurrentStart


def _features(h: ModelHandle) -> dict[str, int]:
    """The shape of the forward the handle is closing on this thread (None where the adapter
    does not keep it)."""
    read = getattr(h, "forward_features", None)
    got = read() if callable(read) else None
    return dict(got) if got else {}


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def prediction(h: ModelHandle, features: Mapping[str, int]) -> dict[str, Any]:
    """A request's predicted peak (upper bound, in the limit's units), its largest safe batch and the
    budget's figures, for ``h``'s device now; {} when the memory model is off. Never raises for a
    shape the model cannot answer: the figure is then absent."""
    cap = h.capacity
    device = h.last_device
    out: dict[str, Any] = {"device": device}
    if cap is None:
        return out
    budget, _ = cap.budgets.read(device)
    if budget is not None:
        out.update(limit_bytes=budget.limit_bytes, limit=budget.limit,
                   held_elsewhere_bytes=budget.held_elsewhere_bytes, in_use_bytes=budget.in_use_bytes)
    if features:
        try:
            p = cap.predict(features, device)
            out["unit"] = p.unit
            # past capacity.max_extrapolation there is no upper bound, only the fit's own estimate:
            # still the figure that tells a request far too big from the rest (it is the lower one)
            peak = p.upper_bytes if p.upper_bytes is not None else p.estimate_bytes
            if peak is not None:
                out["predicted_peak_bytes"] = int(peak)
            n = cap.max_safe_batch_for(features, device)
            if n is not None:
                out["max_safe_batch"] = int(n)
        except ValueError:  # a shape the model rejects (ShapeError): no prediction
            pass
    return out


def flight_prediction(handles: Callable[[], Mapping[str, ModelHandle]]) -> Callable[[str, Mapping[str, int]], dict[str, Any]]:
    """What the black box asks for a forward in flight: ``(model, features) -> figures``."""
    def predict(model: str, features: Mapping[str, int]) -> dict[str, Any]:
        h = handles().get(model)
        if h is None or not features:
            return {}
        got = prediction(h, features)
        return {k: got[k] for k in ("device", "unit", "predicted_peak_bytes", "max_safe_batch") if k in got}
    return predict


def _gpu_outside(s: Sample, device: str) -> int | None:
    """This process's device memory outside the caching allocator at a tick: NVML's per-process use
    less the allocator's reserve (None where NVML cannot tell)."""
    try:
        index = int(device.split(":", 1)[1])
    except (IndexError, ValueError):
        return None
    reserved = _int(s.allocators.get(device, {}).get("reserved_bytes"))
    used = next((g.process_used_bytes for g in s.gpus if g.index == index), None)
    if reserved is None or used is None:
        return None
    return max(0, int(used) - reserved)


def _host_outside(s: Sample) -> int | None:
    """Resident memory outside the C heap at a tick: RSS less glibc's in-use bytes (tensors on CPU
    are allocated from that heap)."""
    rss = _int(s.process.get("resident_memory_bytes"))
    heap = _int(s.allocators.get("cpu", {}).get("allocated_bytes"))
    if rss is None or heap is None:
        return None
    return max(0, rss - heap)


def leak_on(watch: LeakWatch | None, model: str, device: str) -> LeakTrend | None:
    """The suspect that bears on ``model`` on ``device``: its layers', the device allocator's, or
    (on CPU) the process's, the one that grew most."""
    if watch is None or not watch.cfg.enabled:
        return None
    best: LeakTrend | None = None
    for k, tr in watch.trends().items():
        if not tr.suspected:
            continue
        bears = ((k.source == LAYER and k.model == model and k.device == device)
                 or (k.source == ALLOCATOR and k.device == device)
                 or (k.source == PROCESS and device == "cpu"))
        if bears and (best is None or tr.growth > best.growth_bytes):
            best = LeakTrend(k.source, k.model, k.layer, k.device, tr.slope, tr.growth, tr.end - tr.start)
    return best


def host_leak(started: CurrentStart) -> Callable[[], dict[str, Any] | None]:
    """What the black box writes with each tick: the suspect on the host (the process's resident
    memory, the C heap, a layer on CPU) that grew most, or None, from the last start's leak watch.
    The kernel kills for the host's memory, so a GPU's suspects are not the post-mortem's."""
    def suspect() -> dict[str, Any] | None:
        watch = started().leaks
        if watch is None or not watch.cfg.enabled:
            return None
        best: tuple[float, dict[str, Any]] | None = None
        for k, tr in watch.trends().items():
            if tr.suspected and k.device in ("", "cpu") and (best is None or tr.growth > best[0]):
                best = (tr.growth, LeakTrend(k.source, k.model, k.layer, k.device, tr.slope, tr.growth,
                                             tr.end - tr.start).to_dict())
        return best[1] if best is not None else None
    return suspect


class OomExplainer:
    """``samples()``: the sampler's recent samples; ``started``: the root's record of the last
    start (its leak watch)."""

    def __init__(self, samples: Callable[[], list[Sample]], started: CurrentStart) -> None:
        self._samples = samples
        self._started = started

    def __call__(self, h: ModelHandle, exc: BaseException) -> dict[str, Any]:
        """The cause of the OOM ``h``'s forward raised, as the ``oom`` dump carries it."""
        return classify(self.figures(h, exc)).to_dict()

    def figures(self, h: ModelHandle, exc: BaseException) -> OomFigures:
        device = h.last_device
        features = _features(h)
        got = prediction(h, features)
        limit, held, static = got.get("limit_bytes"), int(got.get("held_elsewhere_bytes", 0)), got.get("in_use_bytes")
        notes = ["static_bytes: in use when the OOM was read, after the failed forward unwound"] if static is not None else []
        samples = self._samples()
        requested = reserved_free = room_beyond = outside = baseline = None
        if device.startswith("cuda"):
            msg = parse_cuda_message(str(exc))
            if msg.parsed:
                requested, reserved_free = msg.requested_bytes, msg.reserved_free_bytes
                reserved = msg.reserved_bytes
                if reserved is not None:
                    if limit is not None:
                        room_beyond = limit - held - reserved
                    elif msg.allowed_bytes is not None:
                        room_beyond = msg.allowed_bytes - reserved
                    else:
                        room_beyond = msg.device_free_bytes
                    if msg.process_in_use_bytes is not None:
                        outside = max(0, msg.process_in_use_bytes - reserved)
                notes.append("requested, reserved and outside figures: torch's out-of-memory message, at the failure")
            if outside is None and samples:
                outside = _gpu_outside(samples[-1], device)
            baseline = next((v for s in samples if (v := _gpu_outside(s, device)) is not None), None)
            if baseline is not None:
                notes.append("outside_baseline_bytes: NVML's use of this process less the allocator's reserve, "
                             "at the oldest sample held")
        else:
            if samples:
                outside = _host_outside(samples[-1])
            baseline = next((v for s in samples if (v := _host_outside(s)) is not None), None)
        return OomFigures(
            device=device, limit_bytes=limit, limit=got.get("limit"), held_elsewhere_bytes=held,
            static_bytes=static, features=features, predicted_peak_bytes=got.get("predicted_peak_bytes"),
            max_safe_batch=got.get("max_safe_batch"), requested_bytes=requested, reserved_free_bytes=reserved_free,
            room_beyond_reserved_bytes=room_beyond, outside_bytes=outside,
            outside_baseline_bytes=baseline if outside is not None else None,
            leak=leak_on(self._started().leaks, h.name, device), unit=got.get("unit"), notes=tuple(notes))


__all__ = ["OomExplainer", "flight_prediction", "host_leak", "leak_on", "prediction"]
