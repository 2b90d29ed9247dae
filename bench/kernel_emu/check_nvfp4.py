#!/usr/bin/env python3
"""The NVFP4 quantizer kernels, run on the CPU through emu.hpp, against the
CPU reference (`mxswitch quantize --format nvfp4`), byte for byte.

    python3 bench/kernel_emu/check_nvfp4.py [--mxswitch target/release/mxswitch]

Builds nvfp4.cpp with the host C++ compiler (C++20, -ffp-contract=off), then
for f32 and BF16 input, 1x16 blocks and 16x16 tiles, the Hadamard on
neither, either or both directions, round to nearest even and stochastic
rounding, and both amax passes (nvfp4_amax and the tile kernel's), over
awkward shapes and values, compares each direction's codes, scale bytes,
BF16 GEMM operand (decode(code) * s_q), tensor amax and tensor scale t,
and the partial column sums nvfp4_amax takes (bit for bit, in its order).
Ends with "N passed, M failed" and exits 1 on any failure. Only the
standard library is needed.
"""
import array
import subprocess

from emu_check import (SHAPES, E2M1, Tally, bits, chunk_sums, cpu_quantize, e4m3, f32, setup, sums_differ, values,
                       write_input)

# (tile2d, Hadamard along the columns, along the rows, stochastic rounding, amax pass)
CONFIGS = [(0, 0, 0, 0, "auto"), (0, 0, 1, 0, "auto"), (0, 0, 1, 1, "auto"), (1, 0, 0, 0, "auto"),
           (0, 1, 1, 1, "auto"), (0, 0, 1, 0, "tile"), (1, 1, 0, 1, "auto"), (1, 0, 1, 1, "auto")]
SEED, STEP, IDS = 0x1234_5678_9ABC, 41, (6, 7)


def hadamard_amax(groups):
    """max |(1/4) H16 g| over the groups, in f32 with SPEC's butterfly order."""
    m = 0.0
    for g in groups:
        g = list(g)
        for h in (1, 2, 4, 8):
            for j in range(16):
                if j & h == 0:
                    a, b = g[j], g[j + h]
                    g[j], g[j + h] = f32(a + b), f32(a - b)
        m = max(m, max(abs(v) for v in g) * 0.25)
    return m


def tensor_amax(xs, rows, cols, d, hadamard):
    if not hadamard:
        return max((abs(v) for v in xs), default=0.0)
    vr, ln = (rows, cols) if d == "c" else (cols, rows)
    at = (lambda r, i: xs[r * cols + i]) if d == "c" else (lambda r, i: xs[i * cols + r])
    groups = ([at(r, i) if i < ln else 0.0 for i in range(g, g + 16)] for r in range(vr) for g in range(0, ln, 16))
    return hadamard_amax(groups)


def partial_sums(xs, rows, cols):
    """nvfp4_amax's partial column sums: per 128 rows, its 8 warps in order,
    each warp's 16 rows in order."""
    return chunk_sums(xs, rows, cols, [[16 * w + i for i in range(16)] for w in range(8)])


def check_dir(tmp, d, rows, cols, xs, hadamard, cpu):
    vr, ln = (rows, cols) if d == "c" else (cols, rows)
    nb = (ln + 15) // 16
    codes = open(f"{tmp}/out.{d}.codes", "rb").read()
    scales = open(f"{tmp}/out.{d}.scales", "rb").read()
    deq = array.array("H", open(f"{tmp}/out.{d}.deq", "rb").read())
    state = array.array("I", open(f"{tmp}/out.{d}.state", "rb").read())
    ccodes, cscales = cpu["x.codes"][1], cpu["x.scales"][1]
    t = cpu["x.tensor_scale"][1][0]
    bad = []
    for r in range(vr):
        for j in range(nb * 8):
            want = ccodes[r * nb * 8 + j] if d == "c" else ccodes[j * vr + r]
            if codes[r * nb * 8 + j] != want:
                bad.append(f"code byte [{r}, {j}]: {codes[r * nb * 8 + j]:#x}, cpu {want:#x}")
                return bad
        for k in range(nb):
            s = cscales[r * nb + k] if d == "c" else cscales[k * vr + r]
            if scales[r * nb + k] != s:
                bad.append(f"scale [{r}, {k}]: {scales[r * nb + k]:#x}, cpu {s:#x}")
                return bad
            sq = e4m3(s)
            for i in range(16):
                byte = codes[r * nb * 8 + k * 8 + i // 2]
                c = (byte >> (4 * (i % 2))) & 0xF
                v = f32((-1 if c & 8 else 1) * E2M1[c & 7] * sq)
                want = bits(v) >> 16
                if deq[(r * nb + k) * 16 + i] != want:
                    bad.append(f"deq [{r}, {16 * k + i}]: {deq[(r * nb + k) * 16 + i]:#x}, want {want:#x}")
                    return bad
    a = f32(tensor_amax(xs, rows, cols, d, hadamard))
    if state[0] != bits(a):
        bad.append(f"tensor amax bits {state[0]:#x}, want {bits(a):#x}")
    if state[8] != bits(t):
        bad.append(f"tensor scale {state[8]:#x}, cpu {bits(t):#x}")
    return bad


def main():
    args, tmp, exe = setup("nvfp4")
    tally = Tally()
    cases = [(shape, si, dtype, cfg) for si, shape in enumerate(SHAPES) for dtype in ("f32", "bf16")
             for cfg in CONFIGS]
    # A tensor so small that t is subnormal and 1 / t is Inf (the encoders' r = Inf branch).
    cases += [((130, 300), -1, dtype, cfg) for dtype in ("f32", "bf16") for cfg in CONFIGS[:3]]
    for (rows, cols), si, dtype, (tile2d, had_c, had_r, sr, amax) in cases:
        xs = write_input(tmp, values(rows, cols, 300 + si, tiny=si < 0), dtype, rows, cols)
        dirs = ["both", "c", "r"][si % 3] if 0 <= si < 3 else "both"
        sr_arg = f"{SEED},{STEP},{IDS[0]},{IDS[1]}" if sr else "-"
        subprocess.run([exe, f"{tmp}/x.raw", dtype, str(rows), str(cols), str(tile2d), dirs, str(had_c),
                        str(had_r), sr_arg, amax, f"{tmp}/out"], check=True)
        bad = []
        for d, axis, had, tid in [("c", "-1", had_c, IDS[0]), ("r", "0", had_r, IDS[1])]:
            if dirs not in ("both", d):
                continue
            opts = ["--tile2d"] * tile2d + ["--hadamard"] * had + ["--sr", f"{SEED},{STEP},{tid}"] * sr
            cpu, err = cpu_quantize(args, tmp, ["--format", "nvfp4", "--axis", axis, *opts])
            bad += [err] if err else [f"{d}: {e}" for e in check_dir(tmp, d, rows, cols, xs, had, cpu)]
        got = array.array("f", open(f"{tmp}/out.sums", "rb").read())
        if amax == "auto" and not (had_c and dirs != "r"):
            bad += sums_differ(got, partial_sums(xs, rows, cols))
        elif len(got):
            bad.append("column sums written by the tile kernel's amax pass")
        label = (f"{dtype} [{rows}, {cols}] {dirs} tile2d={tile2d} hadamard={had_c}{had_r} "
                 f"sr={sr} amax={amax}{' tiny' if si < 0 else ''}")
        tally.add(label, bad)
    tally.finish()


if __name__ == "__main__":
    main()
