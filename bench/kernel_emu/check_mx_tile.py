#!/usr/bin/env python3
"""The two-direction MX quantizer kernel (mx_tile.cu), run on the CPU through
emu.hpp, against the CPU reference (`mxswitch quantize --format mxfp4 |
mxfp8`), byte for byte.

    python3 bench/kernel_emu/check_mx_tile.py [--mxswitch target/release/mxswitch]

Builds mx_tile.cpp with the host C++ compiler (C++20, -ffp-contract=off),
then for E2M1 and E4M3 elements, the four scale rules, 1x32 blocks and
32x32 tiles, the Hadamard per direction, round to nearest even and
stochastic rounding, f32 and BF16 input, over awkward shapes, compares each
direction's codes, E8M0 scale bytes and BF16 GEMM operand
(decode(code) * 2^(byte - 127)), as mx_tile writes it and as
dequantize_mx_operand (quantize_mx.cu) makes it from the codes, and the
partial column sums (db's first pass) in the kernel's order. Ends with
"N passed, M failed" and exits 1 on any failure. Only the standard library
is needed.
"""
import array
import subprocess

from emu_check import (SHAPES, E2M1, Tally, bf16_bits, chunk_sums, cpu_quantize, e4m3, f32, setup, sums_differ,
                       values, write_input)

MODES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
# (format, scale rule, tile2d, Hadamard on row blocks, on column blocks, stochastic rounding)
CONFIGS = [("mxfp4", "even", 0, 0, 0, 0), ("mxfp4", "even", 0, 0, 1, 1), ("mxfp4", "floor", 1, 0, 0, 0),
           ("mxfp4", "rceil", 0, 1, 1, 1), ("mxfp4", "ceil", 1, 0, 0, 1), ("mxfp8", "rceil", 0, 0, 0, 0),
           ("mxfp8", "even", 0, 1, 0, 1), ("mxfp8", "floor", 1, 0, 0, 1)]
SEED, STEP, IDS = 0xDEAD_BEEF_0042, 7, (10, 11)


def check_dir(tmp, d, rows, cols, fp4, cpu):
    vr, ln = (rows, cols) if d == "c" else (cols, rows)
    plen = (ln + 31) // 32 * 32
    nb, cpr = plen // 32, plen // 2 if fp4 else plen  # blocks and code bytes per view row
    codes = open(f"{tmp}/out.{d}.codes", "rb").read()
    scales = open(f"{tmp}/out.{d}.scales", "rb").read()
    deq = array.array("H", open(f"{tmp}/out.{d}.deq", "rb").read())
    deq2 = array.array("H", open(f"{tmp}/out.{d}.deq2", "rb").read())
    ccodes, cscales = cpu["x.codes"][1], cpu["x.scales"][1]
    for r in range(vr):
        for j in range(cpr):
            want = ccodes[r * cpr + j] if d == "c" else ccodes[j * vr + r]
            if codes[r * cpr + j] != want:
                return [f"code byte [{r}, {j}]: {codes[r * cpr + j]:#x}, cpu {want:#x}"]
        for k in range(nb):
            s = cscales[r * nb + k] if d == "c" else cscales[k * vr + r]
            if scales[r * nb + k] != s:
                return [f"scale [{r}, {k}]: {scales[r * nb + k]:#x}, cpu {s:#x}"]
            scale = 2.0 ** (s - 127)
            for i in range(32):
                e = 32 * k + i
                c = (codes[r * cpr + e // 2] >> (4 * (e % 2))) & 0xF if fp4 else codes[r * cpr + e]
                v = ((-1 if c & 8 else 1) * E2M1[c & 7]) if fp4 else e4m3(c)
                want = bf16_bits(f32(v * scale))
                if deq[r * plen + e] != want:
                    return [f"deq [{r}, {e}]: {deq[r * plen + e]:#x}, want {want:#x}"]
                if deq2[r * plen + e] != want:
                    return [f"dequantize_mx_operand [{r}, {e}]: {deq2[r * plen + e]:#x}, want {want:#x}"]
    return []


def check_sums(tmp, xs, rows, cols):
    """The partial column sums against their order: per 32-row chunk, the
    column's 32 rows in order (the column warp's block, before any Hadamard)."""
    got = array.array("f", open(f"{tmp}/out.sums", "rb").read())
    return sums_differ(got, chunk_sums(xs, rows, cols, [range(32)], chunk_rows=32))


def main():
    args, tmp, exe = setup("mx_tile")
    tally = Tally()
    # The last shape is all below 2^-120: scale bytes so small that the
    # BF16 operand's products are f32 subnormals, which round.
    for si, (rows, cols) in enumerate(SHAPES + [(130, 300)]):
        tiny = si == len(SHAPES)
        for ci, (fmt, mode, tile2d, had_c, had_r, sr) in enumerate(CONFIGS):
            dtype = ("f32", "bf16")[(si + ci) % 2]
            xs = write_input(tmp, values(rows, cols, 500 + si, tiny=tiny), dtype, rows, cols)
            sr_arg = f"{SEED},{STEP},{IDS[0]},{IDS[1]}" if sr else "-"
            elem = "e2m1" if fmt == "mxfp4" else "e4m3fn"
            subprocess.run([exe, f"{tmp}/x.raw", dtype, str(rows), str(cols), elem, str(MODES[mode]), str(tile2d),
                            str(had_c), str(had_r), sr_arg, f"{tmp}/out"], check=True)
            bad = []
            for d, axis, had, tid in [("c", "-1", had_c, IDS[0]), ("r", "0", had_r, IDS[1])]:
                opts = ["--tile2d"] * tile2d + ["--hadamard"] * had + ["--sr", f"{SEED},{STEP},{tid}"] * sr
                cpu, err = cpu_quantize(args, tmp, ["--format", fmt, "--scale-mode", mode, "--axis", axis, *opts])
                bad += [err] if err else [f"{d}: {e}" for e in check_dir(tmp, d, rows, cols, fmt == "mxfp4", cpu)]
            bad += check_sums(tmp, xs, rows, cols)
            tally.add(f"{fmt} {mode} {dtype} [{rows}, {cols}] tile2d={tile2d} hadamard={had_c}{had_r} sr={sr}"
                      f"{' tiny' if tiny else ''}", bad)
    tally.finish()


if __name__ == "__main__":
    main()
