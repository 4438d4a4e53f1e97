/* Device-side copy kernels of etptr's copy engine (etptr/cuda/_kernels.py holds them as
   PTX, loaded with cuModuleLoadData: no compiler is needed at run time).

   etptr_copy_pieces: for every piece p of ``table`` (count entries of {src, dst, n},
   device addresses and a byte count), copy n bytes from src to dst; one block per piece
   (grid-stride over pieces), 16-byte words when src, dst and n allow, else 4-byte words,
   else bytes. It gathers small tensors into a packed scratch area or scatters a packed
   area into separately allocated tensors, so that the PCIe transfer is one large DMA.

   Regenerate the PTX with: nvcc -ptx -arch=compute_75 -O3 -o k.ptx _kernels.cu, then set
   its header to ".version 7.0" / ".target sm_70" (the kernel uses nothing newer), which
   any CUDA 11+ driver can compile for its GPU. */
struct Piece { unsigned long long src, dst, n; };
extern "C" __global__ void etptr_copy_pieces(const Piece* table, unsigned long long count) {
    for (unsigned long long p = blockIdx.x; p < count; p += gridDim.x) {
        const unsigned long long src = table[p].src, dst = table[p].dst, n = table[p].n;
        if (((src | dst | n) & 15ull) == 0) {
            const uint4* s = (const uint4*)src; uint4* d = (uint4*)dst;
            for (unsigned long long i = threadIdx.x; i < n / 16; i += blockDim.x) d[i] = s[i];
        } else if (((src | dst | n) & 3ull) == 0) {
            const unsigned* s = (const unsigned*)src; unsigned* d = (unsigned*)dst;
            for (unsigned long long i = threadIdx.x; i < n / 4; i += blockDim.x) d[i] = s[i];
        } else {
            const unsigned char* s = (const unsigned char*)src; unsigned char* d = (unsigned char*)dst;
            for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
        }
    }
}
