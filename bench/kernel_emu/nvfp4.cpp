// The NVFP4 quantizer kernels (quantize_nvfp4.cu) run on the CPU through
// emu.hpp, launched as runtime/src/cuda/nvfp4.rs launches them
// (quantize_nvfp4_2d). check_nvfp4.py drives it.
//
//   nvfp4 IN f32|bf16 ROWS COLS TILE2D c|r|both HAD_C HAD_R SR AMAX OUT_PREFIX
//
// IN holds ROWS * COLS raw little-endian values. HAD_C and HAD_R (0 or 1)
// ask for the Hadamard per direction (c: along the columns, r: along the
// rows). SR is "-" (round to nearest even) or SEED,STEP,ID_C,ID_R: both
// directions rounded stochastically, each with its tensor id. AMAX is
// "auto" (the host's choice of amax pass) or "tile" (nvfp4_tile's
// PHASE_AMAX, whatever the Hadamard). Writes, per wanted direction D,
// OUT_PREFIX.D.{codes,scales,deq,state} as the device buffers hold them, and
// OUT_PREFIX.sums, the partial column sums nvfp4_amax takes (one row per 128
// input rows; empty when the amax pass is the tile kernel's).
// Unwritten bytes keep a 0xA5 fill (the state starts zeroed, as the host's).
#include "emu.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../runtime/kernels/common.cuh"
#include "../../runtime/kernels/quantize_nvfp4.cu"

struct Out {
    std::vector<unsigned char> codes, scales;
    std::vector<u16> deq;
    std::vector<u32> state;
};

int main(int argc, char** argv) {
    if (argc != 12) {
        std::fprintf(stderr, "usage: nvfp4 IN f32|bf16 ROWS COLS TILE2D c|r|both HAD_C HAD_R SR AMAX OUT_PREFIX\n");
        return 2;
    }
    const std::string dtype = argv[2], dirs = argv[6], sr = argv[9], amax = argv[10], prefix = argv[11];
    const size_t rows = std::strtoul(argv[3], nullptr, 10), cols = std::strtoul(argv[4], nullptr, 10);
    const int tile2d = std::atoi(argv[5]);
    const int had[2] = {std::atoi(argv[7]), std::atoi(argv[8])};
    const bool bf16 = dtype == "bf16";
    const std::vector<unsigned char> x = read_file(argv[1]);
    if (x.size() != rows * cols * (bf16 ? 2 : 4)) { std::fprintf(stderr, "input size\n"); return 2; }
    unsigned long long seed = 0, step = 0, ids[2] = {0, 0};
    if (sr != "-" && std::sscanf(sr.c_str(), "%llu,%llu,%llu,%llu", &seed, &step, &ids[0], &ids[1]) != 4) {
        std::fprintf(stderr, "SR: SEED,STEP,ID_C,ID_R or -\n");
        return 2;
    }
    const bool want[2] = {dirs != "r", dirs != "c"};
    const size_t views[2][2] = {{rows, cols}, {cols, rows}};
    Out o[2];
    NvDir nd[2] = {};
    for (int k = 0; k < 2; ++k) {
        if (!want[k]) continue;
        const size_t vr = views[k][0], padded = (views[k][1] + 15) / 16 * 16, nb = vr * padded / 16;
        o[k].codes.assign(nb * 8, 0xA5);
        o[k].scales.assign(nb, 0xA5);
        o[k].deq.assign(nb * 16, 0xA5A5);
        o[k].state.assign(12, 0u);
        nd[k] = NvDir{o[k].codes.data(), o[k].scales.data(), o[k].deq.data(), o[k].state.data(), had[k],
                      sr != "-", MxSrKey{(u32)seed, (u32)(seed >> 32), (u32)step, (u32)ids[k]}};
    }
    const void* xp = x.data();
    const u32 R = (u32)rows, C = (u32)cols;
    const NvDir cd = nd[0], rd = nd[1];
    std::vector<u32> sums;  // the amax pass's partial column sums, when it is nvfp4_amax
    if (rows * cols > 0) {
        const unsigned gx = (unsigned)((cols + NV_SLAB - 1) / NV_SLAB), gy = (unsigned)((rows + NV_SLAB - 1) / NV_SLAB);
        auto tile = [&](int phase) {
            launch2d(gx, gy, NV_THREADS, [=] {
                if (bf16) nvfp4_tile_bf16(xp, R, C, cd, rd, tile2d, phase);
                else nvfp4_tile_f32(xp, R, C, cd, rd, tile2d, phase);
            });
        };
        if (cd.hadamard || amax == "tile") {
            tile(NV_PHASE_AMAX);
        } else {
            const size_t vec_cols = 32 * (bf16 ? 8 : 4);
            sums.assign((rows + 127) / 128 * cols, 0xA5A5A5A5u);
            float* sp = (float*)sums.data();
            launch2d((unsigned)((cols + vec_cols - 1) / vec_cols), (unsigned)((rows + 127) / 128), NV_THREADS, [=] {
                if (bf16) nvfp4_amax_bf16(xp, R, C, cd, rd, sp);
                else nvfp4_amax_f32(xp, R, C, cd, rd, sp);
            });
        }
        tile(NV_PHASE_QUANTIZE);
    }
    const char* names[2] = {"c", "r"};
    for (int k = 0; k < 2; ++k) {
        if (!want[k]) continue;
        const std::string p = prefix + "." + names[k];
        write_file(p + ".codes", o[k].codes.data(), o[k].codes.size());
        write_file(p + ".scales", o[k].scales.data(), o[k].scales.size());
        write_file(p + ".deq", o[k].deq.data(), 2 * o[k].deq.size());
        write_file(p + ".state", o[k].state.data(), 4 * o[k].state.size());
    }
    write_file(prefix + ".sums", sums.data(), 4 * sums.size());
    return 0;
}
