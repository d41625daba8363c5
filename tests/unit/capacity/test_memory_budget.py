"""Which limit applies and what is available under it: plain arithmetic on given readings."""
from __future__ import annotations

from memprof_otel.capacity.memory_budget import cuda_budget, host_budget, tighter

GiB = 1 << 30


def test_cuda_counts_other_processes_and_non_allocator_memory_as_held_elsewhere():
    # 80 GiB device, 20 GiB free: 60 in use by someone; our allocator reserved 50 of it, so 10 GiB
    # are other processes or our CUDA context; of our 50 reserved, 30 are allocated
    b = cuda_budget("cuda:0", 80 * GiB, 20 * GiB, 50 * GiB, 30 * GiB, False, 0.05, 0)
    assert b.limit == "cuda_device" and b.held_elsewhere_bytes == 10 * GiB
    assert b.margin_bytes == 4 * GiB
    assert b.usable_bytes == 66 * GiB
    assert b.available_bytes == 36 * GiB  # free 20 + cached-but-free 20 - margin 4


def test_mig_slice_is_named_and_margin_bytes_wins_when_larger():
    b = cuda_budget("cuda:0", 10 * GiB, 9 * GiB, 0, 0, True, 0.01, 1 * GiB)
    assert b.limit == "mig" and b.margin_bytes == GiB and b.available_bytes == 8 * GiB


def test_host_prefers_a_cgroup_limit_below_physical_memory():
    b = host_budget(4 * GiB, 3 * GiB, 64 * GiB, 40 * GiB, 0.0, 0)
    assert (b.limit, b.limit_bytes, b.in_use_bytes, b.available_bytes) == ("cgroup", 4 * GiB, 3 * GiB, GiB)
    b = host_budget(None, None, 64 * GiB, 40 * GiB, 0.0, 0)
    assert (b.limit, b.in_use_bytes, b.available_bytes) == ("physical", 24 * GiB, 40 * GiB)
    b = host_budget(128 * GiB, 3 * GiB, 64 * GiB, 40 * GiB, 0.0, 0)  # a cgroup limit above the machine
    assert b.limit == "physical" and b.notes


def test_a_configured_limit_applies_only_when_it_is_tighter():
    detected = host_budget(None, None, 64 * GiB, 40 * GiB, 0.0, 0)
    own = tighter(detected, 8 * GiB, 2 * GiB, 0.0, 0)
    assert (own.limit, own.available_bytes) == ("configured", 6 * GiB)
    assert tighter(detected, 100 * GiB, 2 * GiB, 0.0, 0) is detected
    assert tighter(None, 8 * GiB, 2 * GiB, 0.0, 0).limit == "configured"
    assert tighter(detected, None, 2 * GiB, 0.0, 0) is detected
