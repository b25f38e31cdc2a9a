// The gated delta net's CUDA kernel (vendor/llama.cpp/ggml/src/ggml-cuda/gated_delta_net.cu) on its
// own, at the 27B's shapes (48 value heads of 128 over 16 query/key heads, one sequence): its time
// per launch for a chain and for a tree (test-backend-ops' tree: a spine of 16, then one-token
// branches) of 1-32 tokens, its inputs resident in L2 as in a verify, and its outputs written to a
// file, so that two builds of the kernel (GPU_GDN_SRC: a variant's folder, searched first) can be
// compared bit for bit. Built and run by scripts/gpu_run.sh gdn-bench:
//
//     nvcc -O3 -std=c++17 -arch=sm_90 [-I<variant>] -I<ggml>/include -I<ggml>/src -I<ggml>/src/ggml-cuda \
//         scripts/cuda/gdn_bench.cu -o gdn_bench -Xlinker --unresolved-symbols=ignore-all
//     ./gdn_bench OUT.bin [ITERS]    # CSV: form,n_tokens,us
//
// A tree keeps its saved states as the op does (gated_delta_net_tree_slots): up to
// gdn_tree_shared_slots (4) in a block's shared memory, the rest in global memory.
// GDN_BENCH_CASES=chain16,tree23: only those forms and token counts (as for a profiler's run).
#include "gated_delta_net.cu" // GPU_GDN_SRC first, then the patched tree (-I)

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_timer.cuh"

static constexpr int S_V = 128, H = 48, H_QK = 16;

// what the kernel's launcher takes from ggml-cuda.cu, which the bench does not link
int ggml_cuda_get_device() {
    int id = 0;
    CK(cudaGetDevice(&id));
    return id;
}
void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error: %s in %s at %s:%d (%s)\n", msg, func, file, line, stmt);
    exit(1);
}

// test-backend-ops' init_tree_parents: a spine of max(16, (n + 1) / 2) tokens, then single-token
// branches off it, deepest first
static std::vector<int32_t> tree_parents(int n) {
    const int spine = std::min(n, std::max(16, (n + 1) / 2));
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) {
        p[i] = i < spine ? i - 1 : spine - 2 - (i - spine);
    }
    return p;
}

template <bool tree>
static void launch(const float * q, const float * k, const float * v, const float * g, const float * b,
        const float * s, float * dst, int n, const int32_t * parent, float * slots, const gdn_tree_slots & ts,
        cudaStream_t stream) {
    const int64_t sq1 = S_V, sq2 = S_V * H_QK, sq3 = sq2 * n;
    const int64_t sv1 = S_V, sv2 = S_V * H, sv3 = sv2 * n;
    const int64_t sb1 = 1, sb2 = H, sb3 = H * n;
    float * state = dst + (size_t) S_V * H * n;
    const size_t smem = tree ? ts.smem : 0;
    // the kernel and geometry the series launches (launch_gated_delta_net): a tree a warp a column, 4
    // columns a block; a chain gdn_lanes lanes a column, gdn_cols columns a block
    const int lanes = tree ? 32 : gdn_lanes<S_V>, cols = tree ? 4 : gdn_cols;
    gdn_kernel<S_V, false, false, tree>(smem, lanes * cols)<<<dim3(H, 1, S_V / cols), dim3(lanes, cols, 1), smem, stream>>>(
        q, k, v, g, b, s, dst, state, H, n, 1, sq1, sq2, sq3, sv1, sv2, sv3, sb1, sb2, sb3,
        init_fastdiv_values(H_QK), init_fastdiv_values(1), 1.0f / sqrtf((float) S_V), 0, 1,
        parent, slots, (int64_t) S_V * S_V * H, ts.n_slots, ts.n_shared);
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT.bin [ITERS]\n", argv[0]);
        return 2;
    }
    const int iters = argc > 2 ? atoi(argv[2]) : 2000;
    FILE * out = fopen(argv[1], "wb");
    if (out == nullptr) {
        perror(argv[1]);
        return 1;
    }
    launch_timer timer;
    cudaStream_t stream = timer.stream;
    printf("form,n_tokens,us\n");
    for (const int tree : {0, 1}) {
        for (const int n : {1, 2, 8, 16, 17, 23, 24, 32}) {
            if (!env_lists("GDN_BENCH_CASES", std::string(tree ? "tree" : "chain") + std::to_string(n))) {
                continue;
            }
            std::mt19937 rng(1234 + n);
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            auto rand_vec = [&](size_t len, float scale, float shift) {
                std::vector<float> x(len);
                for (float & f : x) {
                    f = shift + scale * u(rng);
                }
                return x;
            };
            // q, k of norm about 0.6 (the model L2-normalises them), g a log-decay below 0, beta in (0, 1)
            const auto hq = rand_vec((size_t) S_V * H_QK * n, 0.09f, 0.0f);
            const auto hk = rand_vec((size_t) S_V * H_QK * n, 0.09f, 0.0f);
            const auto hv = rand_vec((size_t) S_V * H * n, 1.0f, 0.0f);
            const auto hg = rand_vec((size_t) H * n, 0.5f, -0.6f);
            const auto hb = rand_vec((size_t) H * n, 0.45f, 0.5f);
            const auto hs = rand_vec((size_t) S_V * S_V * H, 0.1f, 0.0f);
            const auto hp = tree_parents(n);
            const size_t n_dst = (size_t) S_V * H * n + (size_t) S_V * S_V * H;
            float *q, *k, *v, *g, *b, *s, *dst;
            int32_t * parent;
            auto up = [&](float ** d, const std::vector<float> & h) {
                CK(cudaMalloc(d, h.size() * sizeof(float)));
                CK(cudaMemcpy(*d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
            };
            up(&q, hq); up(&k, hk); up(&v, hv); up(&g, hg); up(&b, hb); up(&s, hs);
            CK(cudaMalloc(&dst, n_dst * sizeof(float)));
            CK(cudaMalloc(&parent, n * sizeof(int32_t)));
            CK(cudaMemcpy(parent, hp.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
            const gdn_tree_slots ts = gated_delta_net_tree_slots(S_V, n, 4);
            float * slots = nullptr;
            if (tree && ts.n_slots > ts.n_shared) {
                CK(cudaMalloc(&slots, (ts.n_slots - ts.n_shared) * (size_t) S_V * S_V * H * sizeof(float)));
            }
            auto run = [&]() {
                if (tree) {
                    launch<true>(q, k, v, g, b, s, dst, n, parent, slots, ts, stream);
                } else {
                    launch<false>(q, k, v, g, b, s, dst, n, nullptr, nullptr, {}, stream);
                }
            };
            for (int i = 0; i < 50; ++i) {
                run();
            }
            CK(cudaStreamSynchronize(stream));
            const float us = timer.us(iters, [&](int) { run(); });
            CK(cudaGetLastError());
            printf("%s,%d,%.2f\n", tree ? "tree" : "chain", n, us);
            std::vector<float> hd(n_dst);
            CK(cudaMemcpy(hd.data(), dst, n_dst * sizeof(float), cudaMemcpyDeviceToHost));
            fwrite(hd.data(), sizeof(float), hd.size(), out);
            for (void * p : {(void *) q, (void *) k, (void *) v, (void *) g, (void *) b, (void *) s, (void *) dst, (void *) parent, (void *) slots}) {
                CK(cudaFree(p));
            }
        }
    }
    fclose(out);
    return 0;
}
