"""glibc's mmap threshold: when it is fixed, by whom, and what is left alone."""
from __future__ import annotations

from typing import Any

import pytest

from memprof_otel.config import ConfigError, load_config
from memprof_otel.sources import mmap_threshold as mt


class Libc:
    """A stand-in for libc's mallopt, recording its calls (the real one cannot be undone)."""

    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: Any, value: Any) -> int:
        self.calls.append((param.value, value.value))
        return self.answer


@pytest.fixture(autouse=True)
def fresh() -> Any:
    mt.reset_for_tests()
    yield
    mt.reset_for_tests()


def test_auto_fixes_it_only_under_a_limit() -> None:
    assert mt.decide("auto", limit_in_force=True) == 1 << 20
    assert mt.decide("auto", limit_in_force=False) is None
    assert mt.decide("off", limit_in_force=True) is None
    assert mt.decide(65536, limit_in_force=False) == 65536


def test_applied_once_with_mallopt_under_a_limit() -> None:
    libc = Libc()
    st = mt.apply("auto", True, {}, "glibc", libc=libc)
    assert st.fixed and st.bytes == 1 << 20 and st.by == "memprof-otel"
    assert libc.calls == [(-3, 1 << 20)]  # M_MMAP_THRESHOLD
    assert mt.apply(4096, True, {}, "glibc", libc=libc) is st  # once per process
    assert len(libc.calls) == 1 and mt.state() is st


@pytest.mark.parametrize("env, expected", [({"MALLOC_MMAP_THRESHOLD_": "262144"}, 262144),
                                           ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=0x20000"},
                                            0x20000)])
def test_what_the_environment_fixed_is_left_as_it_is(env: dict[str, str], expected: int) -> None:
    libc = Libc()
    st = mt.apply("auto", True, env, "glibc", libc=libc)
    assert (st.bytes, st.by) == (expected, "environment") and libc.calls == []


def test_nothing_is_done_without_a_limit_or_glibc_or_when_refused() -> None:
    libc = Libc()
    st = mt.apply("auto", False, {}, "glibc", libc=libc)
    assert not st.fixed and "no memory limit" in (st.reason or "") and libc.calls == []
    mt.reset_for_tests()
    st = mt.apply("auto", True, {}, "jemalloc", libc=libc)
    assert not st.fixed and "jemalloc" in (st.reason or "") and libc.calls == []
    mt.reset_for_tests()
    st = mt.apply(1 << 20, True, {}, "glibc", libc=Libc(answer=0))
    assert not st.fixed and "refused" in (st.reason or "")


def test_the_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMPROF_OTEL_CAPACITY_MMAP_THRESHOLD", raising=False)  # the suite's own pin
    assert load_config({"capacity": {"mmap_threshold": "2MiB"}}).capacity.mmap_threshold == 2 << 20
    assert load_config({"capacity": {"mmap_threshold": "OFF"}}).capacity.mmap_threshold == "off"
    assert load_config({}).capacity.mmap_threshold == "off"  # shipped: glibc's own policy, nothing process-wide
    for bad in ("64MiB", "1KiB", "sometimes"):
        with pytest.raises(ConfigError, match="mmap_threshold"):
            load_config({"capacity": {"mmap_threshold": bad}})


def test_a_failing_probe_never_stops_monitoring(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise OSError("no /proc here")
    monkeypatch.setattr(mt.HostAllocatorSource, "probe", staticmethod(broken))
    st = mt.apply_configured("auto", None)
    assert not st.fixed and "OSError" in (st.reason or "")


def test_this_process_is_probed_for_real() -> None:
    # no cgroup limit is set for the test runner unless the machine has one: either answer is a state
    st = mt.apply_configured("off", None)
    assert not st.fixed and st.reason is not None and "off" in st.reason
