"""What a framework adapter must provide: the duties ``Instrumentation`` leaves to it.

``Instrumentation`` (``instrumentation.py``) is the handle ``instrument()`` returns, whatever the
framework; it extends this class and is abstract until an adapter (``attribution/torch/``,
``attribution/keras/``) fills in every ``abstractmethod`` here, so an adapter that misses one fails
when its handle is built, not at the first forward that needs it. Those with a body are optional.
This module imports no framework.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only
    from ..dumps.capture import Capture


class FrameworkAdapter(ABC):
    """The handle's parts only the framework can answer: the model and its layers, what its figures
    are read from, attaching and detaching the hooks, and starting a measured forward once the
    forward policy picked one."""

    # Can a capture see each op's allocations (a dispatch to hook, as torch's)? Else its profile
    # weighs the innermost layer calls by their peak increase (``dumps/capture.py``).
    captures_ops = True

    # ---- the model and its layers ------------------------------------------------------------
    @property
    @abstractmethod
    def model(self) -> Any:
        """The instrumented model (None once it was garbage-collected)."""

    @property
    @abstractmethod
    def paused(self) -> bool:
        """True while the hooks are off the model (``pause()``, ``uninstrument()``)."""

    @property
    @abstractmethod
    def layer_count(self) -> int:
        """Layer paths tracked (after max_depth, include/exclude and the max_layers fold)."""

    @abstractmethod
    def layer_objects(self) -> list[tuple[str, Any]]:
        """``(path, layer object)`` for every layer of the model, in its order (empty once the model
        was garbage-collected)."""

    @abstractmethod
    def object_paths(self) -> dict[int, str]:
        """``id(layer object) -> layer path`` for every layer of the model, tracked or not."""

    # ---- what the figures are ----------------------------------------------------------------
    @property
    @abstractmethod
    def attribution_method(self) -> str:
        """What the per-layer figures are read from (the summary's ``method``)."""

    def figures_note(self) -> str:
        """What the per-layer figures are read from, or why there are none (``/v1/status``)."""
        return self.attribution_method

    def held_tensors(self) -> dict[str, dict[tuple[str, int], int]]:
        """What the model holds, by kind: ``weights`` (its parameters and buffers) and ``kv_cache``
        (the tensors of the KV cache its last forward was called with, while that cache lives), each
        ``(device, storage key) -> bytes`` with a shared storage once. Empty where the adapter cannot
        tell (the memory breakdown then says the model's weights are not counted)."""
        return {}

    # ---- the hooks ---------------------------------------------------------------------------
    @abstractmethod
    def _detach(self) -> None:
        """Take every hook off the model."""

    @abstractmethod
    def _reattach(self) -> None:
        """Put the hooks back after ``pause()``."""

    def _release_open_forwards(self) -> None:
        """End the attributed forwards still open in other threads (uninstrument's cleanup)."""

    def _close_abandoned(self) -> None:
        """Close this thread's forward an exception abandoned (a KeyboardInterrupt between its
        hooks) now, rather than at the next forward: ``reset_stats`` asks first, so a forward from
        before the reset is not counted after it. Adapters that never leave one open need nothing."""

    # ---- a measured forward (called back by ``ForwardPolicy.choose``) --------------------------
    @abstractmethod
    def _begin_attributed(self, opener: Any, path: str, t: float, cap: Capture | None, compiled: bool) -> None:
        """Start measuring this thread's forward per layer (``cap``: the capture that claimed it);
        leave ``state`` set on the thread's ``ForwardRecord`` when it measures."""

    @abstractmethod
    def _begin_root_reading(self, opener: Any, t: float) -> None:
        """Start reading a model forward the scheduler left plain at its root only."""


__all__ = ["FrameworkAdapter"]
