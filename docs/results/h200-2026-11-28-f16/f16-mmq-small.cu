// Experiment (not in the series): a Q4_K small-batch matmul that dequantizes the weights to f16
// and multiplies them with f16 MMAs (m16n8k16, f32 sums), so a sub-block's scale is applied once a
// weight instead of once a weight block, column and sub-block as the int8 kernel does. Included by
// scripts/cuda/mmqs_bench.cu in place of the patched tree's mmq-small.cu (GPU_MMQS_SRC), which it
// includes first.
#include "../../vendor/llama.cpp/ggml/src/ggml-cuda/mmq-small.cu" // from .carry/f16k/ of the checkout

#include <cuda_fp16.h>

#include "../../scripts/cuda/bench_timer.cuh"

static const float * mmqs_f16_yf = nullptr; // the bench's float activations (n columns of k)
#define MMQS_BENCH_YF mmqs_f16_yf

// A lane (g = lane/4, c = lane%4) holds, of each of its rows, the 32 quant bytes 32c..32c+31: the
// sub-blocks 2c (low nibbles) and 2c+1 (high). The k16 step (i, h) of a block of 256 takes its word
// i (bytes 4i..4i+3) and nibble h; position 2c, 2c+1, 2c+8, 2c+9 of the step is byte 4i+0, 4i+2,
// 4i+1, 4i+3. The activations are laid out in that order (mmqs_f16_prep): for block kb, word i,
// column n and lane c one uint4 = the two steps' B registers.
// half 1024 + q (mask 0x000F000F) or 1024 + 16q (0x00F000F0): one LOP3 with the magic in a
// register (LOP3 takes one immediate, so C's (w & mask) | magic becomes two)
template <uint32_t MASK>
static __device__ __forceinline__ uint32_t f16_nib(uint32_t w, uint32_t magic) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(MASK), "r"(magic));
    return r;
}
static __device__ __forceinline__ uint32_t f16_fma(uint32_t x, half2 s, half2 o) {
    const half2 r = __hfma2(*(const half2 *) &x, s, o);
    return *(const uint32_t *) &r;
}
static __device__ __forceinline__ void f16_mma16(float * c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
        uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void f16_mma8(float * c, uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(b0));
}

// one thread a (kb, i, column, c): the step pair's B registers, and at i = 0 the sums of the
// column's sub-blocks 2c and 2c+1 (the mins' B register)
static __global__ void mmqs_f16_prep(const float * y, uint4 * yp, half2 * ys, int k, int n, int npad) {
    const int nb  = k / QK_K;
    const int idx = blockIdx.x*blockDim.x + threadIdx.x;
    const int c = idx & 3, col = (idx >> 2) % npad, i = ((idx >> 2) / npad) % 8, kb = (idx >> 2) / npad / 8;
    if (kb >= nb) return;
    __align__(16) half v[8];
    float sum[2] = {0.0f, 0.0f};
    const int off[4] = {0, 2, 1, 3};
    for (int h = 0; h < 2; ++h) {
        const int base = kb*QK_K + 32*(2*c + h);
        for (int e = 0; e < 4; ++e) {
            v[4*h + e] = __float2half(col < n ? y[(size_t) col*k + base + 4*i + off[e]] : 0.0f);
        }
        if (i == 0 && col < n) {
            for (int l = 0; l < 32; ++l) sum[h] += __half2float(__float2half(y[(size_t) col*k + base + l]));
        }
    }
    yp[idx] = *(const uint4 *) v;
    if (i == 0) ys[((size_t) kb*npad + col)*4 + c] = __floats2half2_rn(sum[0], sum[1]);
}

// RT tiles of 16 rows a block, NT tiles of 8 columns (one pass: n <= 8 NT); 4 warps split the
// blocks of K and add their sums at the end
template <int NT, int RT, int LD>
static __global__ void __launch_bounds__(128) mmqs_f16(const char * __restrict__ vx, const uint4 * __restrict__ yp,
        const half2 * __restrict__ ys, float * __restrict__ dst, const int nb, const int m, const int n, const int npad) {
    const int lane = threadIdx.x, warp = threadIdx.y, g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x*16*RT;
    float acc[RT][NT][4] = {};
    uint32_t magic = 0x64006400u;
    asm volatile("" : "+r"(magic)); // kept in a register (see f16_nib)
    const block_q4_K * x = (const block_q4_K *) vx;
    for (int kb = warp; kb < nb; kb += 4) {
        uint4 head[RT][2], qs[RT][2][2];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const block_q4_K * b = x + (size_t) min(row0 + 16*r + 8*h + g, m - 1)*nb + kb;
                head[r][h]  = mmqs_ldw<LD>((const uint4 *) b);
                qs[r][h][0] = mmqs_ldw<LD>((const uint4 *) (b->qs + 32*c));
                qs[r][h][1] = mmqs_ldw<LD>((const uint4 *) (b->qs + 32*c + 16));
            }
        }
        half2 lo_s[RT][2], lo_o[RT][2], hi_s[RT][2], hi_o[RT][2];
        uint32_t amin[RT][2];
        float dd[RT][2], dm[RT][2];
        const int sh = 16*(c & 1);
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t a = (head[r][h].y >> sh) & 0xFFFF, b = (head[r][h].z >> sh) & 0xFFFF;
                const uint32_t e = (head[r][h].w >> sh) & 0xFFFF;
                const uint32_t sc = c < 2 ? a & 0x3F3F : (e & 0x0F0F) | ((a & 0xC0C0) >> 2);
                const uint32_t mn = c < 2 ? b & 0x3F3F : ((e >> 4) & 0x0F0F) | ((b & 0xC0C0) >> 2);
                const half s0 = __uint2half_rn(sc & 0xFF), s1 = __uint2half_rn(sc >> 8);
                lo_s[r][h] = __half2half2(s0);
                lo_o[r][h] = __half2half2(__hmul(s0, __float2half(-1024.0f)));
                hi_s[r][h] = __half2half2(__hmul(s1, __float2half(0.0625f)));
                hi_o[r][h] = __half2half2(__hmul(s1, __float2half(-64.0f)));
                const half2 mnh = __halves2half2(__uint2half_rn(mn & 0xFF), __uint2half_rn(mn >> 8));
                amin[r][h] = *(const uint32_t *) &mnh;
                const half2 dmh = *(const half2 *) &head[r][h].x;
                dd[r][h] = __low2float(dmh);
                dm[r][h] = __high2float(dmh);
            }
        }
        float cc[RT][NT][4] = {}, cm[RT][NT][4] = {};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            uint4 bf[NT];
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                bf[t] = yp[((size_t) (kb*8 + i)*npad + 8*t + g)*4 + c];
            }
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const uint32_t w0 = ((const uint32_t *) &qs[r][0][i/4])[i % 4]; // row g
                const uint32_t w1 = ((const uint32_t *) &qs[r][1][i/4])[i % 4]; // row g + 8
                const uint32_t a0 = f16_fma(f16_nib<0x000F000Fu>(w0, magic), lo_s[r][0], lo_o[r][0]);
                const uint32_t a1 = f16_fma(f16_nib<0x000F000Fu>(w1, magic), lo_s[r][1], lo_o[r][1]);
                const uint32_t a2 = f16_fma(f16_nib<0x000F000Fu>(w0 >> 8, magic), lo_s[r][0], lo_o[r][0]);
                const uint32_t a3 = f16_fma(f16_nib<0x000F000Fu>(w1 >> 8, magic), lo_s[r][1], lo_o[r][1]);
#pragma unroll
                for (int t = 0; t < NT; ++t) f16_mma16(cc[r][t], a0, a1, a2, a3, bf[t].x, bf[t].y);
                const uint32_t b0 = f16_fma(f16_nib<0x00F000F0u>(w0, magic), hi_s[r][0], hi_o[r][0]);
                const uint32_t b1 = f16_fma(f16_nib<0x00F000F0u>(w1, magic), hi_s[r][1], hi_o[r][1]);
                const uint32_t b2 = f16_fma(f16_nib<0x00F000F0u>(w0 >> 8, magic), hi_s[r][0], hi_o[r][0]);
                const uint32_t b3 = f16_fma(f16_nib<0x00F000F0u>(w1 >> 8, magic), hi_s[r][1], hi_o[r][1]);
#pragma unroll
                for (int t = 0; t < NT; ++t) f16_mma16(cc[r][t], b0, b1, b2, b3, bf[t].z, bf[t].w);
            }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const half2 bs = ys[((size_t) kb*npad + 8*t + g)*4 + c];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                f16_mma8(cm[r][t], amin[r][0], amin[r][1], *(const uint32_t *) &bs);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[r][t][e] += dd[r][e/2]*cc[r][t][e] - dm[r][e/2]*cm[r][t][e];
                }
            }
        }
    }
    __shared__ float red[4][RT*NT*4][32];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[warp][(r*NT + t)*4 + e][lane] = acc[r][t][e];
    __syncthreads();
    for (int idx = warp; idx < RT*NT*4; idx += 4) {
        const int r = idx / (NT*4), t = (idx / 4) % NT, e = idx % 4;
        const int row = row0 + 16*r + g + 8*(e >> 1), col = 8*t + 2*c + (e & 1);
        if (row < m && col < n) {
            dst[(size_t) col*m + row] = red[0][idx][lane] + red[1][idx][lane] + red[2][idx][lane] + red[3][idx][lane];
        }
    }
}

template <int NT, int RT, int LD>
static void run_f16(const char * x, const char * y, float * d, int m, int k, int n, cudaStream_t st) {
    GGML_UNUSED(y);
    static uint4 * yp = nullptr;
    static half2 * ys = nullptr;
    static const float * last = nullptr;
    static int last_n = -1, last_k = -1;
    const int npad = 8*NT, nb = k/QK_K;
    if (last != mmqs_f16_yf || last_n != n || last_k != k) { // the layout, once per activations (not timed)
        if (yp) { CK(cudaFree(yp)); CK(cudaFree(ys)); }
        CK(cudaMalloc(&yp, (size_t) nb*8*npad*4*sizeof(uint4)));
        CK(cudaMalloc(&ys, (size_t) nb*npad*4*sizeof(half2)));
        const int threads = nb*8*npad*4;
        mmqs_f16_prep<<<(threads + 255)/256, 256, 0, st>>>(mmqs_f16_yf, yp, ys, k, n, npad);
        CK(cudaStreamSynchronize(st));
        last = mmqs_f16_yf; last_n = n; last_k = k;
    }
    mmqs_f16<NT, RT, LD><<<(m + 16*RT - 1)/(16*RT), dim3(WARP_SIZE, 4), 0, st>>>(x, yp, ys, d, nb, m, n, npad);
}
