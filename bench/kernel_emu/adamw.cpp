// The multi-tensor AdamW kernel and the gradient norm's two kernels
// (adamw.cu) run on the CPU through emu.hpp, launched as
// runtime/src/cuda/adamw.rs launches them. check_adamw.py drives it.
//
//   adamw IN GRID OUT_PREFIX
//
// IN: u64 count, then per parameter u32 kind (AdamWTensor.kind), u32 pad
// (the gradient multiplier's f32 bits), u64 n and the 8 f32 AdamWScalars;
// then per parameter its w (f32 or BF16 by kind bit 0), g (f32 or BF16 by
// bit 1), m and v (f32). GRID caps the CTAs of the chunked launches (fewer
// CTAs than chunks exercises their grid-stride loops). Writes
// OUT_PREFIX.adamw (per parameter: w out, m, v, as stored) and
// OUT_PREFIX.sumsq (the f64 partial sum of each chunk of the gradients,
// then the total).
#include "emu.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../runtime/kernels/common.cuh"
#include "../../runtime/kernels/adamw.cu"

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: adamw IN GRID OUT_PREFIX\n");
        return 2;
    }
    const std::vector<unsigned char> in = read_file(argv[1]);
    const unsigned long long grid = std::strtoull(argv[2], nullptr, 10);
    const std::string prefix = argv[3];
    size_t at = 0;
    auto take = [&](void* dst, size_t n) {
        if (at + n > in.size()) { std::fprintf(stderr, "input too short\n"); std::exit(2); }
        std::memcpy(dst, in.data() + at, n);
        at += n;
    };
    u64 count = 0;
    take(&count, 8);
    std::vector<AdamWTensor> ts(count);
    std::vector<GradTensor> gs(count);
    u64 chunks = 0;
    for (auto& t : ts) {
        take(&t.kind, 4);
        take(&t.pad, 4);
        take(&t.n, 8);
        take(&t.s, sizeof(AdamWScalars));
        t.chunk_begin = chunks;
        chunks += (t.n + MT_CHUNK - 1) / MT_CHUNK;
    }
    // Each parameter's buffers, updated in place (w_out = w_in, as the host may).
    std::vector<std::vector<unsigned char>> bufs;
    for (size_t i = 0; i < count; ++i) {
        AdamWTensor& t = ts[i];
        const size_t wb = (t.kind & 1) ? 2 : 4, gb = (t.kind & 2) ? 2 : 4;
        for (size_t bytes : {wb * t.n, gb * t.n, 4 * t.n, 4 * t.n}) {
            bufs.emplace_back(bytes);
            take(bufs.back().data(), bytes);
        }
        const size_t k = 4 * i;
        t.w_in = t.w_out = (u64)bufs[k].data();
        t.g = (u64)bufs[k + 1].data();
        t.m = (u64)bufs[k + 2].data();
        t.v = (u64)bufs[k + 3].data();
        gs[i] = GradTensor{t.g, 0, t.n, t.chunk_begin, (t.kind & 2) ? 1u : 0u, 0u};
    }
    const unsigned ctas = (unsigned)(chunks < grid ? chunks : grid);
    // The norm reads the gradients before AdamW runs, as a step does.
    std::vector<double> partial(chunks), total(1);
    const GradTensor* gp = gs.data();
    double *pp = partial.data(), *tp = total.data();
    launch(ctas, MT_THREADS, [=] { grad_sumsq_partial(gp, count, chunks, pp); });
    launch(1, MT_THREADS, [=] { grad_sumsq_final(pp, chunks, tp); });
    const AdamWTensor* tab = ts.data();
    launch(ctas, MT_THREADS, [=] { adamw_multi(tab, count, chunks); });
    std::vector<unsigned char> out;
    for (size_t i = 0; i < count; ++i) {
        for (size_t k : {4 * i, 4 * i + 2, 4 * i + 3}) out.insert(out.end(), bufs[k].begin(), bufs[k].end());
    }
    write_file(prefix + ".adamw", out.data(), out.size());
    partial.push_back(total[0]);
    write_file(prefix + ".sumsq", partial.data(), 8 * partial.size());
    return 0;
}
