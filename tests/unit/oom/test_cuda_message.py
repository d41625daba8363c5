"""torch's CUDA out-of-memory message read back: the figures in both of its forms, each exact to
the half hundredth of its unit that ``format_size`` prints."""
from __future__ import annotations

import pytest

from memprof_otel.oom.cuda_message import format_size, parse

MIB = 1 << 20
GIB = 1 << 30

MODERN = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which "
          "1.25 MiB is free. Process 4242 has 79.14 GiB memory in use. Including non-PyTorch memory, this process "
          "has 79.14 GiB memory in use. Of the allocated memory 78.50 GiB is allocated by PyTorch, and 123.45 MiB "
          "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
OLD = ("CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already "
       "allocated; 47.06 MiB free; 2.00 GiB allowed; 188.00 MiB reserved in total by PyTorch) If reserved memory "
       "is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")


def near(got: int | None, value: float, unit: int) -> bool:
    return got is not None and abs(got - value * unit) <= 0.005 * unit + 1


def test_the_modern_message():
    m = parse(MODERN)
    assert m.parsed and m.requested_bytes == 20 * MIB
    assert near(m.device_total_bytes, 79.15, GIB) and near(m.device_free_bytes, 1.25, MIB)
    assert near(m.process_in_use_bytes, 79.14, GIB) and near(m.allocated_bytes, 78.50, GIB)
    assert near(m.reserved_free_bytes, 123.45, MIB)
    assert m.reserved_bytes == m.allocated_bytes + m.reserved_free_bytes
    assert m.allowed_bytes is None


def test_the_old_message_with_a_fraction():
    m = parse(OLD)
    assert m.requested_bytes == 36 * MIB and near(m.allowed_bytes, 2.0, GIB)
    assert near(m.reserved_bytes, 188.0, MIB) and near(m.allocated_bytes, 130.35, MIB)
    assert m.reserved_free_bytes == m.reserved_bytes - m.allocated_bytes
    assert near(m.device_free_bytes, 47.06, MIB)


def test_zero_free_is_a_figure_and_other_text_is_none():
    m = parse("CUDA out of memory. Tried to allocate 512 bytes. GPU 1 has a total capacity of 1.00 GiB of which "
              "0 bytes is free.")
    assert m.requested_bytes == 512 and m.device_free_bytes == 0 and m.allocated_bytes is None
    assert not parse("RuntimeError: DefaultCPUAllocator: can't allocate memory").parsed


@pytest.mark.parametrize("n", [0, 1000, 1024, 1025, 3 * MIB + 12345, GIB, 5 * GIB + 7])
def test_format_size_round_trips_within_its_precision(n):
    m = parse(f"Tried to allocate {format_size(n)}.")
    unit = 1 if n <= 1024 else 1024 if n <= MIB else MIB if n <= GIB else GIB
    assert abs(m.requested_bytes - n) <= 0.005 * unit + 1
