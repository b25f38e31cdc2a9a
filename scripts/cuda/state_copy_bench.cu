// What copying a slot's delta-net state to the host costs, the way llama.cpp's state API does it
// (one ggml_backend_tensor_get a layer: a cudaMemcpyAsync to the destination, then a wait), by
// destination: a fresh std::vector (zero-filled by resize, as common_prompt_checkpoint::update_tgt
// and server_prompt_cache::alloc make it), a vector used before, fresh memory left untouched, and
// pinned memory (cudaMallocHost), direct or as a staging buffer a memcpy then empties. The 27B's
// state: 48 layers of 48 x 128 x 128 floats (3 MiB) plus a conv row (small). Built and run by
// docs/results/h200-2026-11-30-ckpt2/run.sh:
//
//     nvcc -O3 -std=c++17 scripts/cuda/state_copy_bench.cu -o state_copy_bench && ./state_copy_bench
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static constexpr int    LAYERS = 48;
static constexpr size_t S_BYTES = 48ull * 128 * 128 * 4;  // a layer's delta-net state
static constexpr size_t R_BYTES = 3ull * 10240 * 4;       // a layer's conv state (3 columns of q, k, v)

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// the state API's copy: each layer's two tensors, each a copy and a wait
static void copy_layers(uint8_t * dst, const uint8_t * s, const uint8_t * r, cudaStream_t st) {
    size_t off = 0;
    for (int il = 0; il < LAYERS; ++il) {
        CK(cudaMemcpyAsync(dst + off, r + il * R_BYTES, R_BYTES, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        off += R_BYTES;
        CK(cudaMemcpyAsync(dst + off, s + il * S_BYTES, S_BYTES, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        off += S_BYTES;
    }
}

int main() {
    const size_t total = LAYERS * (S_BYTES + R_BYTES);
    uint8_t *s = nullptr, *r = nullptr;
    CK(cudaMalloc(&s, LAYERS * S_BYTES));
    CK(cudaMalloc(&r, LAYERS * R_BYTES));
    CK(cudaMemset(s, 1, LAYERS * S_BYTES));
    CK(cudaMemset(r, 2, LAYERS * R_BYTES));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("state %.1f MiB; ms a copy (3 runs)\n", total / 1048576.0);
    for (int rep = 0; rep < 3; ++rep) {
        // a fresh vector: resize's zero-fill first touches every page, then the copy
        double t0 = now_ms();
        {
            std::vector<uint8_t> v;
            v.resize(total);
            double t1 = now_ms();
            copy_layers(v.data(), s, r, st);
            printf("fresh vector: resize %.1f + copy %.1f = %.1f\n", t1 - t0, now_ms() - t1, now_ms() - t0);
        }
        // a vector whose pages were touched before
        std::vector<uint8_t> used(total, 0);
        t0 = now_ms();
        copy_layers(used.data(), s, r, st);
        printf("used vector: copy %.1f\n", now_ms() - t0);
        // fresh memory, untouched: the copy's own page faults
        uint8_t * raw = (uint8_t *) malloc(total);
        t0 = now_ms();
        copy_layers(raw, s, r, st);
        printf("fresh malloc, untouched: copy %.1f\n", now_ms() - t0);
        free(raw);
        // pinned
        uint8_t * pinned = nullptr;
        t0 = now_ms();
        CK(cudaMallocHost(&pinned, total));
        double t1 = now_ms();
        copy_layers(pinned, s, r, st);
        double t2 = now_ms();
        printf("pinned: cudaMallocHost %.1f, copy %.1f\n", t1 - t0, t2 - t1);
        // pinned staging, one wait for all, then a memcpy into a used vector / a fresh one
        t0 = now_ms();
        size_t off = 0;
        for (int il = 0; il < LAYERS; ++il) {
            CK(cudaMemcpyAsync(pinned + off, r + il * R_BYTES, R_BYTES, cudaMemcpyDeviceToHost, st));
            off += R_BYTES;
            CK(cudaMemcpyAsync(pinned + off, s + il * S_BYTES, S_BYTES, cudaMemcpyDeviceToHost, st));
            off += S_BYTES;
        }
        CK(cudaStreamSynchronize(st));
        t1 = now_ms();
        memcpy(used.data(), pinned, total);
        t2 = now_ms();
        std::vector<uint8_t> fresh2(total);
        double t3 = now_ms();
        memcpy(fresh2.data(), pinned, total);
        printf("pinned, one wait: copy %.1f; memcpy to a used vector %.1f; fresh vector resize %.1f + memcpy %.1f\n",
               t1 - t0, t2 - t1, t3 - t2, now_ms() - t3);
        CK(cudaFreeHost(pinned));
        // registering a used vector's pages as pinned, then the copy
        t0 = now_ms();
        CK(cudaHostRegister(used.data(), total, cudaHostRegisterDefault));
        t1 = now_ms();
        copy_layers(used.data(), s, r, st);
        t2 = now_ms();
        CK(cudaHostUnregister(used.data()));
        printf("used vector registered: register %.1f, copy %.1f, unregister %.1f\n", t1 - t0, t2 - t1, now_ms() - t2);
        // fresh memory on huge pages (the kernel's transparent huge pages, asked for)
        void * huge = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(huge, total, MADV_HUGEPAGE);
        t0 = now_ms();
        copy_layers((uint8_t *) huge, s, r, st);
        printf("fresh mmap, huge pages asked: copy %.1f\n", now_ms() - t0);
        munmap(huge, total);
    }
    return 0;
}
