"""The Python object heap from CPython's own arena statistics: the parse, a real allocation of small
objects seen at its size, and the back-off that keeps the walk's cost bounded."""
from __future__ import annotations

import sys

import pytest

from memprof_otel.sources.python_heap import PythonHeapSource, parse_stats

MIB = 1 << 20

SAMPLE = """Small block threshold = 512, in 32 size classes.

class   size   num pools   blocks in use  avail blocks
-----   ----   ---------   -------------  ------------
    0     16           1             110           914

# arenas allocated total           =                   47
# arenas reclaimed                 =                    0
# arenas highwater mark            =                   47
# arenas allocated current         =                   47
47 arenas * 1048576 bytes/arena    =           49,283,072

# bytes in allocated blocks        =           47,199,200
# bytes in available blocks        =              280,672
54 unused pools * 16384 bytes      =              884,736
# bytes lost to pool headers       =              139,968
# bytes lost to quantization       =              155,904
# bytes lost to arena alignment    =              622,592
Total                              =           49,283,072
"""


def test_parse_takes_the_arenas_less_unused_pools_and_alignment():
    resident, arenas = parse_stats(SAMPLE)
    assert arenas == 49_283_072
    assert resident == 49_283_072 - 884_736 - 622_592
    # the parts CPython lists add up to the arenas: blocks in use and free, headers, quantization
    assert resident == 47_199_200 + 280_672 + 139_968 + 155_904
    with pytest.raises(ValueError):
        parse_stats("something else entirely")


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="pymalloc is CPython's")
def test_a_million_small_objects_raise_the_figure_by_their_block_size():
    src = PythonHeapSource(min_interval_s=0.0, max_overhead_ratio=1.0)
    before = src.read().resident_bytes
    # 2**20 floats: each a 24-byte object in a 32-byte pymalloc block (sizes round up to 16 B)
    held = [float(i) + 0.5 for i in range(1 << 20)]
    block = -(-sys.getsizeof(held[0]) // 16) * 16
    after = src.read().resident_bytes
    grown = after - before
    expected = len(held) * block  # the list's pointer array (8 MiB) is malloc'd: not pymalloc's
    # tolerance: pool headers (48 B of each 16 KiB pool: 0.3 %), pools partly filled at the ends,
    # other small objects the interpreter made meanwhile (well under 1 MiB here)
    assert abs(grown - expected) < 0.03 * expected + MIB, (grown, expected)
    del held


def test_reads_back_off_by_their_measured_cost():
    t = [0.0]
    calls = []

    def stats() -> str:
        calls.append(t[0])
        t[0] += 0.002  # each read costs 2 ms
        return SAMPLE

    src = PythonHeapSource(stats_text=stats, min_interval_s=0.0, max_overhead_ratio=0.01, clock=lambda: t[0],
                           wall=lambda: 1000.0 + t[0])
    assert src.min_interval_s == pytest.approx(0.2)  # 2 ms at most 1 % of the time
    first = src.read()
    assert len(calls) == 1 and first.read_at == pytest.approx(1000.002)
    t[0] += 0.1
    assert src.read() is first and len(calls) == 1  # too soon: the last reading, with its time
    t[0] += 0.2
    src.read()
    assert len(calls) == 2
