"""The copy engine's device-side kernels, as PTX (source: ``_kernels.cu`` beside this file).

``COPY_PIECES`` copies a table of (src, dst, nbytes) pieces between device
addresses, one thread block per piece: it gathers small tensors into a packed
scratch area before one large device->host DMA, or scatters a packed area into
separately allocated tensors after one large host->device DMA. The PTX targets
ISA 7.0 / sm_70 and is compiled by the driver for the GPU at hand.
"""

COPY_PIECES_NAME = b"etptr_copy_pieces"
PIECE_BYTES = 24            # struct {u64 src, dst, n}

COPY_PIECES = b"""
.version 7.0
.target sm_70
.address_size 64

	// .globl	etptr_copy_pieces

.visible .entry etptr_copy_pieces(
	.param .u64 etptr_copy_pieces_param_0,
	.param .u64 etptr_copy_pieces_param_1
)
{
	.reg .pred 	%p<11>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<14>;
	.reg .b64 	%rd<39>;


	ld.param.u64 	%rd20, [etptr_copy_pieces_param_0];
	ld.param.u64 	%rd21, [etptr_copy_pieces_param_1];
	mov.u32 	%r1, %ctaid.x;
	cvt.u64.u32 	%rd35, %r1;
	setp.ge.u64 	%p1, %rd35, %rd21;
	@%p1 bra 	$L__BB0_14;

	mov.u32 	%r2, %tid.x;
	cvt.u64.u32 	%rd2, %r2;
	mov.u32 	%r3, %nctaid.x;
	cvt.u64.u32 	%rd3, %r3;
	mov.u32 	%r4, %ntid.x;
	cvt.u64.u32 	%rd4, %r4;
	cvta.to.global.u64 	%rd5, %rd20;

$L__BB0_2:
	mul.lo.s64 	%rd22, %rd35, 24;
	add.s64 	%rd23, %rd5, %rd22;
	ld.global.u64 	%rd7, [%rd23+8];
	ld.global.u64 	%rd8, [%rd23];
	or.b64  	%rd24, %rd7, %rd8;
	ld.global.u64 	%rd9, [%rd23+16];
	or.b64  	%rd10, %rd24, %rd9;
	and.b64  	%rd25, %rd10, 15;
	setp.eq.s64 	%p2, %rd25, 0;
	@%p2 bra 	$L__BB0_10;

	and.b64  	%rd26, %rd10, 3;
	setp.eq.s64 	%p3, %rd26, 0;
	@%p3 bra 	$L__BB0_7;

	setp.le.u64 	%p4, %rd9, %rd2;
	@%p4 bra 	$L__BB0_13;

	mov.u64 	%rd36, %rd2;

$L__BB0_6:
	add.s64 	%rd27, %rd8, %rd36;
	ld.u8 	%rs1, [%rd27];
	add.s64 	%rd28, %rd7, %rd36;
	st.u8 	[%rd28], %rs1;
	add.s64 	%rd36, %rd36, %rd4;
	setp.lt.u64 	%p5, %rd36, %rd9;
	@%p5 bra 	$L__BB0_6;
	bra.uni 	$L__BB0_13;

$L__BB0_10:
	shr.u64 	%rd16, %rd9, 4;
	setp.le.u64 	%p8, %rd16, %rd2;
	@%p8 bra 	$L__BB0_13;

	mov.u64 	%rd38, %rd2;

$L__BB0_12:
	shl.b64 	%rd32, %rd38, 4;
	add.s64 	%rd33, %rd7, %rd32;
	add.s64 	%rd34, %rd8, %rd32;
	ld.v4.u32 	{%r6, %r7, %r8, %r9}, [%rd34];
	st.v4.u32 	[%rd33], {%r6, %r7, %r8, %r9};
	add.s64 	%rd38, %rd38, %rd4;
	setp.lt.u64 	%p9, %rd38, %rd16;
	@%p9 bra 	$L__BB0_12;
	bra.uni 	$L__BB0_13;

$L__BB0_7:
	shr.u64 	%rd13, %rd9, 2;
	setp.le.u64 	%p6, %rd13, %rd2;
	@%p6 bra 	$L__BB0_13;

	mov.u64 	%rd37, %rd2;

$L__BB0_9:
	shl.b64 	%rd29, %rd37, 2;
	add.s64 	%rd30, %rd8, %rd29;
	ld.u32 	%r5, [%rd30];
	add.s64 	%rd31, %rd7, %rd29;
	st.u32 	[%rd31], %r5;
	add.s64 	%rd37, %rd37, %rd4;
	setp.lt.u64 	%p7, %rd37, %rd13;
	@%p7 bra 	$L__BB0_9;

$L__BB0_13:
	add.s64 	%rd35, %rd35, %rd3;
	setp.lt.u64 	%p10, %rd35, %rd21;
	@%p10 bra 	$L__BB0_2;

$L__BB0_14:
	ret;

}
"""
