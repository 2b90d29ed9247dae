// Runs mxswitch's CUDA kernels on the CPU, one OS thread per CUDA thread,
// so that a kernel can be checked bit for bit against the CPU reference on a
// machine without a GPU. It is a check of the kernels' logic (indexing,
// padding, shared-memory reductions, barriers), compiled by the host
// compiler with IEEE f32 and no FMA contraction, as NVRTC compiles them
// (--fmad=false). It says nothing about speed, and the few platform
// instructions (cvt.rn.satfinite) run as HIP runs them: through the portable
// encoder.
//
// Model: blocks run one after another; the threads of a block run
// concurrently and meet at __syncthreads (a std::barrier). `__shared__`
// variables are function statics, shared by the block's threads. Kernels
// that use warp-level functions (sync_warp) are not supported.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 blockDim, gridDim;
inline std::barrier<>* emu_barrier = nullptr;

inline void __syncthreads() { emu_barrier->arrive_and_wait(); }

inline unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
// CUDA's __byte_perm: byte i of the result is byte s_i of the 8 bytes {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// The HIP platform prelude's portable encoder (platform_hip.cuh).
template <bool e5m2, class Encode>
inline unsigned int fp8x2_rne_satfinite(float hi, float lo, Encode encode) {
    return (encode(hi) << 8) | encode(lo);
}

// Runs `kernel` over a grid of gx x gy blocks of `threads` threads.
template <class K>
void launch2d(unsigned gx, unsigned gy, unsigned threads, K kernel) {
    blockDim = {threads, 1, 1};
    gridDim = {gx, gy, 1};
    for (unsigned by = 0; by < gy; ++by) {
        for (unsigned bx = 0; bx < gx; ++bx) {
            std::barrier<> bar(threads);
            emu_barrier = &bar;
            std::vector<std::thread> ts;
            ts.reserve(threads);
            for (unsigned t = 0; t < threads; ++t) {
                ts.emplace_back([=] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    kernel();
                    // An exited thread no longer holds the others at a barrier.
                    emu_barrier->arrive_and_drop();
                });
            }
            for (auto& t : ts) t.join();
        }
    }
}

// Runs `kernel` over `blocks` blocks of `threads` threads.
template <class K>
void launch(unsigned blocks, unsigned threads, K kernel) {
    launch2d(blocks, 1, threads, kernel);
}

// The drivers' files: a whole file's bytes, and bytes written to a file (a
// failure ends the run with status 2).
inline std::vector<unsigned char> read_file(const char* p) {
    FILE* f = std::fopen(p, "rb");
    if (!f) { std::perror(p); std::exit(2); }
    std::vector<unsigned char> b;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) b.insert(b.end(), buf, buf + n);
    std::fclose(f);
    return b;
}

inline void write_file(const std::string& p, const void* d, size_t n) {
    FILE* f = std::fopen(p.c_str(), "wb");
    if (!f || std::fwrite(d, 1, n, f) != n) { std::perror(p.c_str()); std::exit(2); }
    std::fclose(f);
}
