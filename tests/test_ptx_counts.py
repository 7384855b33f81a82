"""The PTX comparison's access counts (benchmarks/ptx_counts.py): guards that depend only on the
thread and block index decide how many threads execute an access; other guards, and loops,
count every thread."""
from __future__ import annotations

from benchmarks.ptx_counts import count_accesses

HEAD = """.visible .entry k(
	.param .u64 .ptr .align 1 k_param_0
)
{
	ld.param.b64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %ctaid.x;
"""

# A row per block: every thread loads, lane 0 of warp 0 (tid == 0) stores past a branch.
ROW_STORE = HEAD + """	ld.global.nc.v4.b32 	{%r3, %r4, %r5, %r6}, [%rd2];
	setp.ne.b32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	st.global.b32 	[%rd2], %r3;
$L__BB0_2:
	ret;
}
"""

# Threads below 100 of the grid (shl/or: 32 * bid + tid), predicated store; then a store
# guarded by a loaded value (unknown: every thread counts).
PREDICATED = HEAD + """	shl.b32 	%r3, %r2, 5;
	or.b32 	%r4, %r3, %r1;
	setp.lt.u32 	%p1, %r4, 100;
	@%p1 st.global.b32 	[%rd2], %r4;
	ld.global.b32 	%r5, [%rd2];
	setp.eq.s32 	%p2, %r5, 0;
	@%p2 st.global.b32 	[%rd2], %r5;
	ret;
}
"""

# A block placed after the ret that branches back (not a loop), and a real loop.
OUT_OF_LINE = HEAD + """	ld.global.b32 	%r3, [%rd2];
	setp.eq.s32 	%p1, %r3, 0;
	@%p1 bra 	$L__BB0_2;
$L__BB0_1:
	st.global.b32 	[%rd2], %r3;
	ret;
$L__BB0_2:
	bra.uni 	$L__BB0_1;
}
"""
LOOP = HEAD + """	mov.u32 	%r3, 0;
$L__BB0_1:
	ld.global.b32 	%r4, [%rd2];
	add.s32 	%r3, %r3, 1;
	setp.lt.u32 	%p1, %r3, 8;
	@%p1 bra 	$L__BB0_1;
	st.global.b32 	[%rd2], %r4;
	ret;
}
"""


def test_a_store_guarded_to_one_thread_per_block_counts_once_per_block():
    c = count_accesses(ROW_STORE, grid=4, block=64)
    assert (c.loads, c.load_bytes, c.stores, c.store_bytes) == (256, 256 * 16, 4, 16)


def test_predicates_on_the_thread_index_count_their_threads_and_others_count_all():
    c = count_accesses(PREDICATED, grid=4, block=32)
    assert c.stores == 100 + 128 and c.loads == 128


def test_only_cycles_of_the_control_flow_graph_are_loops():
    c = count_accesses(OUT_OF_LINE, grid=2, block=32)
    assert (c.looped_loads, c.looped_stores, c.stores) == (0, 0, 64)
    c = count_accesses(LOOP, grid=2, block=32)
    assert (c.looped_loads, c.loads, c.looped_stores, c.stores) == (1, 0, 0, 64)
