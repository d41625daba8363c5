"""Which limit applies and what is available under it: plain arithmetic on given readings, and
when the reader reads them again."""
from __future__ import annotations

from memprof_otel.capacity.memory_budget import (FILE_ROOM_BYTES, MemoryBudget, cgroup_in_use, cuda_budget,
                                                 host_budget, tighter)
from memprof_otel.capacity.memory_budget_reader import MemoryBudgetReader

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


def test_a_cgroups_page_cache_counts_only_up_to_the_room_code_needs():
    MiB = 1 << 20
    # 900 MiB charged, 300 of it page cache: the kernel reclaims all but the code's room first
    assert cgroup_in_use(900 * MiB, 300 * MiB) == 600 * MiB + FILE_ROOM_BYTES
    # little page cache: all of it counted
    assert cgroup_in_use(900 * MiB, FILE_ROOM_BYTES // 2) == 900 * MiB
    assert cgroup_in_use(900 * MiB, 0) == 900 * MiB
    assert cgroup_in_use(10 * MiB, 20 * MiB) == 10 * MiB  # read a moment apart: never more than usage


def test_a_configured_limit_applies_only_when_it_is_tighter():
    detected = host_budget(None, None, 64 * GiB, 40 * GiB, 0.0, 0)
    own = tighter(detected, 8 * GiB, 2 * GiB, 0.0, 0)
    assert (own.limit, own.available_bytes) == ("configured", 6 * GiB)
    assert tighter(detected, 100 * GiB, 2 * GiB, 0.0, 0) is detected
    assert tighter(None, 8 * GiB, 2 * GiB, 0.0, 0).limit == "configured"
    assert tighter(detected, None, 2 * GiB, 0.0, 0) is detected


class _ScriptedReader(MemoryBudgetReader):
    """The reader with its reads scripted: each device read returns the next in-use figure, and
    this process's own in-use is what ``own`` holds now."""

    def __init__(self, in_use: list[int], own: list[int], forwards: list[int], clock: list[float]) -> None:
        super().__init__(0.0, 0, ttl_s=0.25, clock=lambda: clock[0], forwards=lambda: forwards[0])
        self.in_use, self.own = in_use, own
        self.reads = self.own_reads = 0

    def _read(self, device: str) -> tuple[MemoryBudget | None, str | None]:
        self.reads += 1
        return host_budget(1 << 30, self.in_use[self.reads - 1], 4 << 30, 3 << 30, 0.0, 0), None

    def _process_in_use(self, device: str) -> int | None:
        self.own_reads += 1
        return self.own[0]


MIB = 1 << 20


def test_a_cached_budget_counts_what_this_process_did_since_a_forward_began_or_ended() -> None:
    forwards, clock, own = [7], [100.0], [100 * MIB]
    reader = _ScriptedReader([200 * MIB, 650 * MIB], own, forwards, clock)
    first, _ = reader.read("cpu")
    assert first is not None and first.in_use_bytes == 200 * MIB
    clock[0] += 0.1
    own_reads = reader.own_reads
    # no forward since, within the TTL: the reading as it was, nothing read
    assert reader.read("cpu")[0] == first and (reader.reads, reader.own_reads) == (1, own_reads)
    # a forward began and ended, keeping 80 MiB (what a heap does not give back): the cached
    # reading moves by this process's own in-use since, without reading the device again
    forwards[0] = 9
    own[0] = 180 * MIB
    moved, _ = reader.read("cpu")
    assert moved is not None and moved.in_use_bytes == 280 * MIB and reader.reads == 1
    assert moved.available_bytes == first.available_bytes - 80 * MIB
    own[0] = 60 * MIB  # the next one gave back more than it kept: the figure falls as well
    assert reader.read("cpu")[0].in_use_bytes == 160 * MIB
    clock[0] += 0.3  # past the TTL: the device is read again
    assert reader.read("cpu")[0].in_use_bytes == 650 * MIB and reader.reads == 2
