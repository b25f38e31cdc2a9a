// The small-batch K-quant matmul (vendor/llama.cpp/ggml/src/ggml-cuda/mmq-small.cu) on its own:
// the kernel at each configuration it launches (2, 3 or 4 column tiles a pass, 3, 4 or 8 warps a
// block) against a float reference, and its time per launch at the 27B's shapes, with the weights
// read from DRAM (the launches cycle over copies of the matrix that together outgrow L2), beside
// bounds of its work and its reads. Built and run by scripts/gpu_run.sh mmqs-bench:
//
//     nvcc -O3 -std=c++17 -arch=sm_90 -I<ggml>/include -I<ggml>/src -I<ggml>/src/ggml-cuda \
//         scripts/cuda/mmqs_bench.cu -o mmqs_bench -Xlinker --unresolved-symbols=ignore-all
//     ./mmqs_bench [ITERS]    # CSV: type,m,k,n,variant,us,max_err_ref
//
// A variant is named ntT-wW: T column tiles of 8 a pass, W warps a block, with the blocks an SM
// that the product's launch asks for at that size (mul_mat_q_small_launch). The product takes 2
// tiles up to 16 columns (3 warps for Q4_K and Q5_K where its blocks then fill the waves better),
// 3 at 17-24 columns (one pass), 4 or 2 past that; 8 warps for matrices of few row tiles.
//
// An experiment's folder (GPU_MMQS_SRC) holds an mmq-small.cu that includes the tree's and adds its
// kernels, and mmqs_bench_extra.h, its variants; where it defines MMQS_BENCH_YF (a pointer) that is
// set to the float activations, for variants that lay them out their own way.
// MMQS_BENCH_ONLY=nt2-w4,nt3-w4: those variants only, MMQS_BENCH_NS=16,23 those column counts,
// MMQS_BENCH_M=17408 the matrices of that many rows (as for a profiler's run).
#include "mmq-small.cu" // GPU_MMQS_SRC first, then the patched tree (-I)

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_timer.cuh"

// dst[col*m + row] = sum_k dequant(x[row]) . y[col] in double, from the blocks as ggml lays them out
static void reference(ggml_type type, const std::vector<uint8_t> & x, const std::vector<float> & y, int m, int k, int n,
        std::vector<float> & dst) {
    const int nb = k / QK_K;
    std::vector<float> row(k);
    dst.assign((size_t) m*n, 0.0f);
    for (int r = 0; r < m; ++r) {
        for (int b = 0; b < nb; ++b) {
            float * v = row.data() + b*QK_K;
            if (type == GGML_TYPE_Q6_K) {
                const block_q6_K * q = (const block_q6_K *) x.data() + (size_t) r*nb + b;
                const float d = __half2float(*(const __half *) &q->d);
                for (int l = 0; l < QK_K; ++l) {
                    const int half = l / 128, li = l % 128, j = li / 32, ll = li % 32;
                    const int lo = (q->ql[64*half + 32*(j % 2) + ll] >> (4*(j/2))) & 0xF;
                    const int hi = (q->qh[32*half + ll] >> (2*j)) & 3;
                    v[l] = d * q->scales[8*half + 2*j + ll/16] * ((lo | hi << 4) - 32);
                }
            } else {
                const block_q4_K * q = (const block_q4_K *) x.data() + (size_t) r*nb + b;
                const half2 dm = *(const half2 *) &q->dm;
                const float d = __low2float(dm), dmin = __high2float(dm);
                for (int s = 0; s < 8; ++s) {
                    int sc, mn;
                    const uint8_t * S = q->scales;
                    if (s < 4) { sc = S[s] & 63; mn = S[s + 4] & 63; }
                    else { sc = (S[s + 4] & 0xF) | ((S[s - 4] >> 6) << 4); mn = (S[s + 4] >> 4) | ((S[s] >> 6) << 4); }
                    for (int l = 0; l < 32; ++l) {
                        const int qv = (q->qs[32*(s/2) + l] >> (4*(s % 2))) & 0xF;
                        v[32*s + l] = d*sc*qv - dmin*mn;
                    }
                }
            }
        }
        for (int c = 0; c < n; ++c) {
            double sum = 0;
            for (int i = 0; i < k; ++i) sum += (double) row[i] * y[(size_t) c*k + i];
            dst[(size_t) c*m + r] = (float) sum;
        }
    }
}

// bytes of a block of 256 weights (the bench's Q4_K and Q6_K)
static constexpr __host__ __device__ size_t block_bytes(ggml_type type) {
    return type == GGML_TYPE_Q6_K ? sizeof(block_q6_K) : sizeof(block_q4_K);
}

struct problem {
    ggml_type type; int m, k;
    size_t bs() const { return block_bytes(type); }
    size_t bytes() const { return (size_t) m*(k/QK_K)*bs(); }
};

static std::vector<uint8_t> random_matrix(const problem & p, std::mt19937 & rng) {
    std::vector<uint8_t> x(p.bytes());
    for (auto & b : x) b = (uint8_t) rng();
    std::uniform_real_distribution<float> ud(0.5e-3f, 2e-3f);
    const size_t nblk = x.size() / p.bs();
    for (size_t i = 0; i < nblk; ++i) {
        uint8_t * blk = x.data() + i*p.bs();
        if (p.type == GGML_TYPE_Q6_K) {
            *(__half *) (blk + offsetof(block_q6_K, d)) = __float2half(ud(rng));
        } else {
            ((__half *) blk)[0] = __float2half(ud(rng));
            ((__half *) blk)[1] = __float2half(ud(rng));
        }
    }
    return x;
}

using launcher = void (*)(const char *, const char *, float *, int, int, int, cudaStream_t);

// the blocks an SM that the product's launch asks of the kernel (mul_mat_q_small_launch's minb)
static constexpr int minb_of(int nwarps, int nt) {
    return nt > 2 ? (nwarps == 4 ? 3 : 1) : 16/nwarps;
}

// groups of 16 columns in the activations' layout for n columns: the product's (1 or 2 up to 32
// columns, else 4), and at least those that a pass of nt tiles reads (tiles 0..nt-1 of each pass)
static int layout_groups(int n, int nt) {
    const int ng    = n > 2*MMQS_COLS ? 4 : (n + MMQS_COLS - 1)/MMQS_COLS;
    const int npass = (n + 8*nt - 1)/(8*nt);
    return std::max(ng, (npass*nt + 1)/2);
}

// the kernel over m rows, its weights' addresses clamped to the first mx rows (mx = m: the product)
template <int NWARPS, int NT, ggml_type type>
static void launch(const char * x, const char * y, float * d, int m, int mx, int k, int n, cudaStream_t st) {
    const int ng = layout_groups(n, NT);
    const int npass = (n + 8*NT - 1)/(8*NT);
    mul_mat_k_small<NWARPS, NT, minb_of(NWARPS, NT), type><<<(m + 15)/16*npass, dim3(WARP_SIZE, NWARPS), 0, st>>>(
        x, y, d, ng, npass, k/QK_K, mx, k/QK_K, n, m);
}
template <int NWARPS, int NT, ggml_type type>
static void run_kernel(const char * x, const char * y, float * d, int m, int k, int n, cudaStream_t st) {
    launch<NWARPS, NT, type>(x, y, d, m, m, k, n, st);
}

// Bounds, not products (their max_err_ref means nothing): "compute" is the kernel (4 warps) with
// every block reading the first row tile (its weights stay in L1/L2: the kernel's time without
// DRAM), "read" a plain read of the matrix (16 bytes a load, the time DRAM alone takes),
// "read-tiles" the kernel's own loads of the weights (its tiles, warps and loaders) with no work
// on them.
template <int NT, ggml_type type>
static void run_compute(const char * x, const char * y, float * d, int m, int k, int n, cudaStream_t st) {
    launch<4, NT, type>(x, y, d, m, 16, k, n, st);
}
static __global__ void read_matrix(const uint4 * x, const size_t n, float * d) {
    uint32_t v = 0;
    for (size_t i = blockIdx.x*(size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x*blockDim.x) {
        const uint4 q = __ldg(x + i);
        v ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    if (v == 0x12345678u) {
        d[0] = (float) v;
    }
}
template <ggml_type type>
static __global__ void read_tiles(const char * vx, const int nsb, const int nrows_x, const int64_t stride_row_x, float * d) {
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;
    const int t    = lane % 4;
    const int row0 = blockIdx.x * 16;
    const char * x[2];
    for (int h = 0; h < 2; ++h) {
        x[h] = vx + min(row0 + 8*h + lane/4, nrows_x - 1)*stride_row_x*block_bytes(type);
    }
    uint32_t v = 0;
    for (int kb = warp; kb < nsb; kb += 4) {
        if constexpr (type == GGML_TYPE_Q6_K) {
            mmqs_q6_K_w w;
            mmqs_load_q6_K(x, kb, t, w);
            for (int h = 0; h < 2; ++h) {
                for (int c = 0; c < 4; ++c) v ^= w.ql[h][c].x ^ w.ql[h][c].y;
                for (int c = 0; c < 2; ++c) v ^= w.qh[h][c].x ^ w.qh[h][c].y ^ w.sc[h][c].x ^ w.sc[h][c].y;
                v ^= __float_as_uint(w.d[h]);
            }
        } else {
            mmqs_q4_K_w w;
            mmqs_load_q4_K<type>(x, kb, t, w);
            for (int h = 0; h < 2; ++h) {
                v ^= w.head[h].x ^ w.head[h].y ^ w.head[h].z ^ w.head[h].w;
                for (int c = 0; c < 4; ++c) v ^= w.qs[h][c].x ^ w.qs[h][c].y;
            }
        }
    }
    if (v == 0x12345678u) {
        d[0] = (float) v;
    }
}
// LIMIT: 48 KiB of (unused) shared memory a block, so that 4 blocks share an H200's SM as those of
// the kernel at 2 tiles and 4 warps do (else the loads alone fill the SM with warps)
template <ggml_type type, bool LIMIT>
static void run_read_tiles(const char * x, const char * y, float * d, int m, int k, int n, cudaStream_t st) {
    GGML_UNUSED(y); GGML_UNUSED(n);
    read_tiles<type><<<(m + 15)/16, dim3(WARP_SIZE, 4), LIMIT ? 48*1024 : 0, st>>>(x, k/QK_K, m, k/QK_K, d);
}
template <ggml_type type>
static void run_read(const char * x, const char * y, float * d, int m, int k, int n, cudaStream_t st) {
    GGML_UNUSED(y); GGML_UNUSED(n);
    const size_t bytes = (size_t) m*(k/QK_K)*block_bytes(type);
    static const int nsm = [] {
        int dev = 0;
        int n   = 0;
        CK(cudaGetDevice(&dev));
        CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
        return n;
    }();
    read_matrix<<<nsm*8, 256, 0, st>>>((const uint4 *) x, bytes/16, d);
}

// nt: the tiles a pass (the layout's groups: layout_groups); maxn: its most columns (1 and 3 tiles
// take one pass only: a pass starts at an even tile)
struct variant { std::string name; launcher fn; int nt; int maxn = 64; };

template <ggml_type type>
static std::vector<variant> variants() {
    std::vector<variant> v;
#define MMQS_V(NW, NT) v.push_back({"nt" #NT "-w" #NW, run_kernel<NW, NT, type>, NT, NT == 1 ? 8 : NT == 3 ? 24 : 64})
    // the configurations the product launches (3 warps only for Q4_K and Q5_K: Q6_K's kernel spills
    // at 3 warps' 128 registers)
    if constexpr (type != GGML_TYPE_Q6_K) {
        MMQS_V(3, 1); MMQS_V(3, 2);
    }
    MMQS_V(4, 1); MMQS_V(8, 1);
    MMQS_V(4, 2); MMQS_V(8, 2);
    MMQS_V(4, 3); MMQS_V(8, 3);
    MMQS_V(4, 4); MMQS_V(8, 4);
#undef MMQS_V
    // an experiment's variants, from the folder of GPU_MMQS_SRC (its kernel beside the product's)
#if __has_include("mmqs_bench_extra.h")
#include "mmqs_bench_extra.h"
#endif
    v.push_back({"compute-nt2", run_compute<2, type>, 2});
    v.push_back({"compute-nt4", run_compute<4, type>, 4});
    v.push_back({"read", run_read<type>, 2});
    v.push_back({"read-tiles", run_read_tiles<type, false>, 2});
    v.push_back({"read-tiles-4", run_read_tiles<type, true>, 2});
    return v;
}

int main(int argc, char ** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 40;
    std::mt19937 rng(42);
    const problem probs[] = {
        { GGML_TYPE_Q4_K, 17408, 5120 }, { GGML_TYPE_Q4_K, 5120, 17408 }, { GGML_TYPE_Q6_K, 5120, 17408 },
        { GGML_TYPE_Q4_K, 10240, 5120 },
    };
    const int ns[] = { 1, 2, 4, 8, 16, 17, 23, 24, 32, 40, 48, 64 };
    launch_timer timer;
    cudaStream_t st = timer.stream;
    printf("type,m,k,n,variant,us,max_err_ref\n");
    for (const problem & p : probs) {
        if (!env_lists("MMQS_BENCH_M", std::to_string(p.m))) continue;
        const std::vector<uint8_t> hx = random_matrix(p, rng);
        const int ncopies = (int) std::max<size_t>(2, (size_t) 512*1024*1024 / p.bytes());
        char * dx;
        CK(cudaMalloc(&dx, p.bytes()*ncopies));
        for (int c = 0; c < ncopies; ++c) CK(cudaMemcpy(dx + c*p.bytes(), hx.data(), p.bytes(), cudaMemcpyHostToDevice));
        // the reference over a few rows only (all columns)
        const int mref = 64;
        for (const int n : ns) {
            if (!env_lists("MMQS_BENCH_NS", std::to_string(n))) continue;
            std::vector<float> hy((size_t) n*p.k);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (auto & f : hy) f = nd(rng);
            std::vector<float> ref;
            std::vector<uint8_t> hxr(hx.begin(), hx.begin() + (size_t) mref*(p.k/QK_K)*p.bs());
            reference(p.type, hxr, hy, mref, p.k, n, ref);
            float * dyf; char * dyq; float * dd;
            CK(cudaMalloc(&dyf, hy.size()*sizeof(float)));
            CK(cudaMemcpy(dyf, hy.data(), hy.size()*sizeof(float), cudaMemcpyHostToDevice));
#ifdef MMQS_BENCH_YF
            MMQS_BENCH_YF = dyf; // an experiment's variants may lay the float activations out their own way
#endif
            CK(cudaMalloc(&dyq, (size_t) (p.k/QK_K)*4*MMQS_Y_BYTES));
            CK(cudaMalloc(&dd, (size_t) p.m*n*sizeof(float)));
            const auto vs = p.type == GGML_TYPE_Q6_K ? variants<GGML_TYPE_Q6_K>() : variants<GGML_TYPE_Q4_K>();
            for (const variant & v : vs) {
                if (n > v.maxn || !env_lists("MMQS_BENCH_ONLY", v.name)) continue;
                quantize_q8_1_small<<<dim3(p.k/QK_K, layout_groups(n, v.nt)*MMQS_COLS), WARP_SIZE, 0, st>>>(dyf, dyq, n, p.k);
                CK(cudaMemset(dd, 0, (size_t) p.m*n*sizeof(float)));
                v.fn(dx, dyq, dd, p.m, p.k, n, st);
                CK(cudaStreamSynchronize(st));
                CK(cudaGetLastError());
                std::vector<float> out((size_t) p.m*n);
                CK(cudaMemcpy(out.data(), dd, out.size()*sizeof(float), cudaMemcpyDeviceToHost));
                double err = 0, scale = 0;
                for (int c = 0; c < n; ++c) for (int r = 0; r < mref; ++r) {
                    err = std::max(err, (double) fabsf(out[(size_t) c*p.m + r] - ref[(size_t) c*mref + r]));
                    scale = std::max(scale, (double) fabsf(ref[(size_t) c*mref + r]));
                }
                for (int i = 0; i < 3; ++i) v.fn(dx + (size_t) (i % ncopies)*p.bytes(), dyq, dd, p.m, p.k, n, st);
                const float us = timer.us(iters, [&](int i) {
                    v.fn(dx + (size_t) (i % ncopies)*p.bytes(), dyq, dd, p.m, p.k, n, st);
                });
                printf("%s,%d,%d,%d,%s,%.2f,%.3g\n", p.type == GGML_TYPE_Q6_K ? "q6_K" : "q4_K", p.m, p.k, n, v.name.c_str(), us,
                    err/std::max(scale, 1e-30));
                fflush(stdout);
            }
            CK(cudaFree(dyf)); CK(cudaFree(dyq)); CK(cudaFree(dd));
        }
        CK(cudaFree(dx));
    }
    return 0;
}
