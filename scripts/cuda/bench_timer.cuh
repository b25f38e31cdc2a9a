// What the standalone kernel benches of this folder share: CK, a CUDA call that must succeed, the
// mean time of a run of launches on one stream, and the filters a profiler's run sets.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

struct launch_timer {
    cudaStream_t stream;
    cudaEvent_t  e0, e1;

    launch_timer() {
        CK(cudaStreamCreate(&stream));
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
    }

    // us a launch over `iters` calls of launch(i), which enqueue their work on `stream`
    template <typename F>
    float us(int iters, F && launch) {
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < iters; ++i) {
            launch(i);
        }
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return 1000.0f * ms / iters;
    }
};

// whether the comma-separated list in the environment variable (unset: everything) holds value
static bool env_lists(const char * var, const std::string & value) {
    const char * list = getenv(var);
    return list == nullptr || (std::string(",") + list + ",").find("," + value + ",") != std::string::npos;
}
