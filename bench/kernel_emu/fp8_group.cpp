// The FP8 rowwise and 128-block quantizer kernels (quantize_fp8_group.cu)
// run on the CPU through emu.hpp, launched as runtime/src/cuda/fp8_group.rs
// launches them (quantize_fp8_group_2d). check_fp8_group.py drives it.
//
//   fp8_group IN f32|bf16 ROWS COLS rowwise|block|tiles POW2 c|r|both OUT_PREFIX
//
// IN holds ROWS * COLS raw little-endian values. Writes, per direction D
// (c: along the columns, r: along the rows), OUT_PREFIX.D.{codes,scales,vec,blk}
// as the device buffers hold them, and OUT_PREFIX.flag (the amax word).
// Unwritten bytes of codes, scales and blk keep a 0xA5 fill, so a kernel
// that skips a byte it owns shows up in the comparison.
#include "emu.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../runtime/kernels/common.cuh"
#include "../../runtime/kernels/quantize_fp8_group.cu"

static size_t r16(size_t n) { return (n + 15) / 16 * 16; }

struct Dir {
    std::vector<unsigned char> codes;
    std::vector<float> scales, vec, blk;
    Fp8gOut out{};
};

int main(int argc, char** argv) {
    if (argc != 9) {
        std::fprintf(stderr, "usage: fp8_group IN f32|bf16 ROWS COLS rowwise|block|tiles POW2 c|r|both OUT_PREFIX\n");
        return 2;
    }
    const std::string dtype = argv[2], grouping = argv[5], dirs = argv[7], prefix = argv[8];
    const size_t rows = std::strtoul(argv[3], nullptr, 10), cols = std::strtoul(argv[4], nullptr, 10);
    const int pow2 = std::atoi(argv[6]);
    const bool bf16 = dtype == "bf16", rowwise = grouping == "rowwise", tile2d = grouping == "tiles";
    const std::vector<unsigned char> x = read_file(argv[1]);
    if (x.size() != rows * cols * (bf16 ? 2 : 4)) { std::fprintf(stderr, "input size\n"); return 2; }
    const bool want[2] = {dirs != "r", dirs != "c"};
    const size_t views[2][2] = {{rows, cols}, {cols, rows}};
    Dir d[2];
    for (int k = 0; k < 2; ++k) {
        if (!want[k]) continue;
        const size_t r = views[k][0], l = views[k][1];
        const size_t kp = rowwise ? r16(l) : (l + 127) / 128 * 128, gpr = rowwise ? 1 : kp / 128, rp = r16(r);
        d[k].codes.assign(rp * kp, 0xA5);
        float fill;
        const unsigned fill_bits = 0xA5A5A5A5u;
        std::memcpy(&fill, &fill_bits, 4);
        d[k].scales.assign(gpr * rp, fill);
        d[k].vec.assign(gpr * rp, 0.0f);
        if (tile2d) d[k].blk.assign((r + 127) / 128 * gpr, fill);
        d[k].out = Fp8gOut{d[k].codes.data(), d[k].scales.data(), d[k].vec.data(),
                           tile2d ? d[k].blk.data() : nullptr, (u32)kp, (u32)rp, (u32)gpr, 0};
    }
    const size_t ext_r = std::max<size_t>(d[0].out.r_pad, d[1].out.kp);
    const size_t ext_c = std::max<size_t>(d[0].out.kp, d[1].out.r_pad);
    u32 flag[4] = {0, 0, 0, 0};
    const void* xp = x.data();
    const u32 R = (u32)rows, C = (u32)cols;
    // 128-blocks in both directions also take the column sums, as the
    // linears ask for dy's (one row of partial sums per tile row).
    std::vector<u32> sums;
    if (!rowwise) {
        if (ext_r * ext_c > 0) {
            if (dirs == "both") sums.assign((ext_r + 127) / 128 * cols, 0xA5A5A5A5u);
            float* sp = sums.empty() ? nullptr : (float*)sums.data();
            const u32 tiles_x = (u32)((ext_c + 127) / 128);
            const unsigned blocks = (unsigned)(((ext_r + 127) / 128) * tiles_x);
            const Fp8gOut oc = d[0].out, orr = d[1].out;
            launch(blocks, FP8G_THREADS, [=, &flag] {
                if (bf16) fp8g_block2d_bf16(xp, R, C, tiles_x, oc, orr, tile2d, pow2, flag, sp);
                else fp8g_block2d_f32(xp, R, C, tiles_x, oc, orr, tile2d, pow2, flag, sp);
            });
        }
    } else {
        std::vector<u32> part[2];
        for (int k = 0; k < 2; ++k) {
            if (want[k]) part[k].assign(views[k][0] * ((views[k][1] + 63) / 64), 0xA5A5A5A5u);
        }
        u32* pc = want[0] ? part[0].data() : nullptr;
        u32* pr = want[1] ? part[1].data() : nullptr;
        if (rows * cols > 0) {
            const unsigned blocks = (unsigned)(((rows + 63) / 64) * ((cols + 63) / 64));
            launch(blocks, FP8G_THREADS, [=] {
                if (bf16) fp8g_amax2d_bf16(xp, R, C, pc, pr);
                else fp8g_amax2d_f32(xp, R, C, pc, pr);
            });
        }
        for (int k = 0; k < 2; ++k) {
            if (!want[k] || views[k][0] == 0) continue;
            const u32 vr = (u32)views[k][0], np = (u32)((views[k][1] + 63) / 64);
            const u32* pp = part[k].data();
            float *sp = d[k].scales.data(), *vp = d[k].vec.data();
            launch((unsigned)((vr + 255) / 256), FP8G_THREADS,
                   [=, &flag] { fp8g_scales(pp, vr, np, pow2, sp, vp, flag); });
        }
        if (ext_r * ext_c > 0) {
            const unsigned blocks = (unsigned)(((ext_r + 63) / 64) * ((ext_c + 63) / 64));
            const Fp8gOut oc = d[0].out, orr = d[1].out;
            const u32 ec = (u32)ext_c;
            launch(blocks, FP8G_THREADS, [=] {
                if (bf16) fp8g_encode2d_bf16(xp, R, C, ec, oc, orr);
                else fp8g_encode2d_f32(xp, R, C, ec, oc, orr);
            });
        }
    }
    const char* names[2] = {"c", "r"};
    for (int k = 0; k < 2; ++k) {
        if (!want[k]) continue;
        const std::string p = prefix + "." + names[k];
        write_file(p + ".codes", d[k].codes.data(), d[k].codes.size());
        write_file(p + ".scales", d[k].scales.data(), 4 * d[k].scales.size());
        write_file(p + ".vec", d[k].vec.data(), 4 * d[k].vec.size());
        if (tile2d) write_file(p + ".blk", d[k].blk.data(), 4 * d[k].blk.size());
    }
    write_file(prefix + ".flag", flag, 4);
    write_file(prefix + ".sums", sums.data(), 4 * sums.size());
    return 0;
}
