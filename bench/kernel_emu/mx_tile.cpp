// The two-direction MX quantizer kernel (mx_tile.cu) run on the CPU through
// emu.hpp, launched as runtime/src/cuda/mx_tile.rs launches it, and the
// BF16 GEMM operand dequantize_mx_operand (quantize_mx.cu) of its codes.
// check_mx_tile.py drives it.
//
//   mx_tile IN f32|bf16 ROWS COLS e2m1|e4m3fn MODE TILE2D HAD_ROWB HAD_COLB SR OUT_PREFIX
//
// IN holds ROWS * COLS raw little-endian values. MODE is the kernel's
// ScaleMode (0 FLOOR, 1 CEIL, 2 EVEN, 3 RCEIL). Row blocks (32 elements of a
// row, "c": along the columns) and column blocks ("r": along the rows) are
// both written; HAD_ROWB and HAD_COLB ask for the Hadamard per direction. SR
// is "-" or SEED,STEP,ID_C,ID_R. Writes OUT_PREFIX.D.{codes,scales,deq} for
// D = c, r as the device buffers hold them, and OUT_PREFIX.D.deq2, the
// operand that dequantize_mx_operand makes of the codes and scales, and
// OUT_PREFIX.sums, the partial column sums (one row per 32 input rows);
// unwritten bytes keep a 0xA5 fill.
#include "emu.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../runtime/kernels/common.cuh"
#include "../../runtime/kernels/mx_tile.cu"
#include "../../runtime/kernels/quantize_mx.cu"

int main(int argc, char** argv) {
    if (argc != 12) {
        std::fprintf(stderr, "usage: mx_tile IN f32|bf16 ROWS COLS e2m1|e4m3fn MODE TILE2D HAD_ROWB HAD_COLB SR OUT\n");
        return 2;
    }
    const std::string dtype = argv[2], fmt = argv[5], sr = argv[10], prefix = argv[11];
    const size_t rows = std::strtoul(argv[3], nullptr, 10), cols = std::strtoul(argv[4], nullptr, 10);
    const int mode = std::atoi(argv[6]), tile2d = std::atoi(argv[7]);
    const int had[2] = {std::atoi(argv[8]), std::atoi(argv[9])};
    const bool bf16 = dtype == "bf16", fp4 = fmt == "e2m1";
    const std::vector<unsigned char> x = read_file(argv[1]);
    if (x.size() != rows * cols * (bf16 ? 2 : 4)) { std::fprintf(stderr, "input size\n"); return 2; }
    unsigned long long seed = 0, step = 0, ids[2] = {0, 0};
    if (sr != "-" && std::sscanf(sr.c_str(), "%llu,%llu,%llu,%llu", &seed, &step, &ids[0], &ids[1]) != 4) {
        std::fprintf(stderr, "SR: SEED,STEP,ID_C,ID_R or -\n");
        return 2;
    }
    // Direction 0: row blocks (view [rows, pc]); 1: column blocks (view [cols, pr]).
    const size_t views[2][2] = {{rows, (cols + 31) / 32 * 32}, {cols, (rows + 31) / 32 * 32}};
    std::vector<unsigned char> codes[2], scales[2];
    std::vector<u16> deq[2];
    MxDir md[2];
    for (int k = 0; k < 2; ++k) {
        const size_t n = views[k][0] * views[k][1];
        codes[k].assign(fp4 ? n / 2 : n, 0xA5);
        scales[k].assign(n / 32, 0xA5);
        deq[k].assign(n, 0xA5A5);
        md[k] = MxDir{codes[k].data(), scales[k].data(), deq[k].data(), had[k], sr != "-",
                      MxSrKey{(u32)seed, (u32)(seed >> 32), (u32)step, (u32)ids[k]}};
    }
    const void* xp = x.data();
    const u32 R = (u32)rows, C = (u32)cols;
    const MxDir rd = md[0], cd = md[1];
    std::vector<float> sums((rows + 31) / 32 * cols);
    std::memset(sums.data(), 0xA5, 4 * sums.size());
    float* sp = sums.data();
    if (rows * cols > 0) {
        launch2d((unsigned)((cols + SLAB_COLS - 1) / SLAB_COLS), (unsigned)((rows + 31) / 32), 2 * MX_BLOCK * TILES,
                 [=] {
                     if (fp4 && bf16) mx_tile_e2m1_bf16(xp, R, C, rd, cd, mode, tile2d, sp);
                     else if (fp4) mx_tile_e2m1_f32(xp, R, C, rd, cd, mode, tile2d, sp);
                     else if (bf16) mx_tile_e4m3fn_bf16(xp, R, C, rd, cd, mode, tile2d, sp);
                     else mx_tile_e4m3fn_f32(xp, R, C, rd, cd, mode, tile2d, sp);
                 });
    }
    write_file(prefix + ".sums", sums.data(), 4 * sums.size());
    const char* names[2] = {"c", "r"};
    for (int k = 0; k < 2; ++k) {
        std::vector<u16> deq2(deq[k].size(), 0xA5A5);
        const unsigned long long octets = deq2.size() / 8;
        const unsigned char *cp = codes[k].data(), *sp = scales[k].data();
        u16* dp = deq2.data();
        if (octets > 0) {
            launch((unsigned)((octets + QTHREADS - 1) / QTHREADS), QTHREADS, [=] {
                if (fp4) dequantize_mx_operand_e2m1(cp, sp, dp, octets);
                else dequantize_mx_operand_e4m3fn(cp, sp, dp, octets);
            });
        }
        const std::string p = prefix + "." + names[k];
        write_file(p + ".deq2", deq2.data(), 2 * deq2.size());
        write_file(p + ".codes", codes[k].data(), codes[k].size());
        write_file(p + ".scales", scales[k].data(), scales[k].size());
        write_file(p + ".deq", deq[k].data(), 2 * deq[k].size());
    }
    return 0;
}
