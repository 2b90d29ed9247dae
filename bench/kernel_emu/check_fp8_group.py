#!/usr/bin/env python3
"""The FP8 rowwise and 128-block quantizer kernels, run on the CPU through
emu.hpp, against the CPU reference (`mxswitch quantize`), byte for byte.

    python3 bench/kernel_emu/check_fp8_group.py [--mxswitch target/release/mxswitch]

Builds fp8_group.cpp with the host C++ compiler (g++ or clang++, C++20,
-ffp-contract=off), then for rowwise, 128-blocks and 128 x 128 tiles, f32
and BF16 input, pow2 off and on, and awkward shapes and values (zeros, -0,
subnormals, huge values, rounding ties), compares every direction's codes,
scales, scale_inv and tile scale_inv, the padding (zero codes, zero
scale_inv rows), the amax flag and, for 128-blocks in both directions, the
partial column sums (bit for bit, in the kernel's order). Ends with "N
passed, M failed" and exits 1 on any failure. Only the standard library is
needed.
"""
import array
import random
import subprocess

from emu_check import SHAPES, Tally, bits, chunk_sums, cpu_quantize, setup, sums_differ, write_input


def r16(n):
    return (n + 15) // 16 * 16


def awkward(rows, cols, seed):
    """f32 values over many binades, with zeros, -0, subnormals, huge values
    and E4M3 rounding ties after scaling by a power of two."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows * cols):
        k = rng.random()
        if k < 0.05:
            v = 0.0
        elif k < 0.07:
            v = -0.0
        elif k < 0.09:
            v = rng.choice([1e-40, -3e-42, 1e-45])
        elif k < 0.10:
            v = rng.choice([3e38, -1e30, 6.5e4])
        elif k < 0.20:
            # 1 + m/8 + 1/16: halfway between two E4M3 neighbours.
            v = (1 + rng.randrange(8) / 8 + 1 / 16) * 2.0 ** rng.randrange(-10, 10)
        else:
            v = rng.gauss(0, 1) * 2.0 ** rng.randrange(-20, 20)
        out.append(v)
    return array.array("f", out)


def f32s(path):
    return array.array("f", open(path, "rb").read())


def block_sums(xs, rows, cols):
    """fp8g_block2d's partial column sums: per 128-row tile, its 32 threads
    in order, each thread's rows t, t + 32, t + 64, t + 96 in order."""
    return chunk_sums(xs, rows, cols, [[t + 32 * k for k in range(4)] for t in range(32)])


def check_dir(tmp, d, rows, cols, grouping, cpu):
    """Compares direction d ("c": along the columns, "r": along the rows) of
    the emulated kernels with the CPU's tensors; returns the differences."""
    R, L = (rows, cols) if d == "c" else (cols, rows)
    kp = r16(L) if grouping == "rowwise" else (L + 127) // 128 * 128
    plen = L if grouping == "rowwise" else kp  # the CPU's padded length
    gpr = 1 if grouping == "rowwise" else kp // 128
    rp = r16(R)
    codes = open(f"{tmp}/out.{d}.codes", "rb").read()
    scales, vec = f32s(f"{tmp}/out.{d}.scales"), f32s(f"{tmp}/out.{d}.vec")
    ccodes, cscales = cpu["x.codes"][1], cpu["x.scales"][1]
    bad = []
    # The CPU keeps the input's layout: [R, plen] along the columns,
    # [plen, R] along the rows; scales [R, gpr] or [gpr, R].
    for r in range(rp):
        for i in range(kp):
            got = codes[r * kp + i]
            if r < R and i < plen:
                want = ccodes[r * plen + i] if d == "c" else ccodes[i * R + r]
            else:
                want = 0
            if got != want:
                bad.append(f"code [{r}, {i}]: {got:#x}, cpu {want:#x}")
                break
        if bad:
            break
    for g in range(gpr):
        for r in range(rp):
            s, v = scales[g * rp + r], vec[g * rp + r]
            if r >= R:
                if bits(v) != 0:
                    bad.append(f"scale_inv of padding row {r}: {v}")
                continue
            want = cscales[r * gpr + g] if d == "c" else cscales[g * R + r]
            if bits(s) != bits(want):
                bad.append(f"scale [{r}, {g}]: {s!r}, cpu {want!r}")
            inv = array.array("f", [1.0 / want])[0] if want != 0 else float("inf")
            if bits(v) != bits(inv):
                bad.append(f"scale_inv [{r}, {g}]: {v!r}, want {inv!r}")
    if grouping == "tiles":
        blk = f32s(f"{tmp}/out.{d}.blk")
        for t in range((R + 127) // 128):
            for g in range(gpr):
                want = vec[g * rp + 128 * t]
                if bits(blk[t * gpr + g]) != bits(want):
                    bad.append(f"tile scale_inv [{t}, {g}]: {blk[t * gpr + g]!r}, want {want!r}")
    return bad[:5]


def main():
    args, tmp, exe = setup("fp8_group")
    tally = Tally()
    fmt = {"rowwise": ["--format", "fp8-rowwise"], "block": ["--format", "fp8-block"],
           "tiles": ["--format", "fp8-block", "--tile2d"]}
    for grouping in ["rowwise", "block", "tiles"]:
        for dtype in ["f32", "bf16"]:
            for pow2 in [0, 1]:
                for si, (rows, cols) in enumerate(SHAPES):
                    xs = write_input(tmp, awkward(rows, cols, 100 + si), dtype, rows, cols)
                    dirs = ["both", "c", "r"][si % 3] if si < 3 else "both"
                    subprocess.run([exe, f"{tmp}/x.raw", dtype, str(rows), str(cols), grouping, str(pow2), dirs,
                                    f"{tmp}/out"], check=True)
                    bad = []
                    for d, axis in [("c", "-1"), ("r", "0")]:
                        if dirs not in ("both", d):
                            continue
                        opts = [*fmt[grouping], "--axis", axis, "--pow2", "true" if pow2 else "false"]
                        cpu, err = cpu_quantize(args, tmp, opts)
                        bad += [err] if err else [f"{d}: {e}" for e in check_dir(tmp, d, rows, cols, grouping, cpu)]
                    # The flag: the largest |x| bits.
                    want_flag = max((bits(v) & 0x7FFFFFFF for v in xs), default=0)
                    got_flag = array.array("I", open(f"{tmp}/out.flag", "rb").read())[0]
                    if got_flag != want_flag:
                        bad.append(f"flag {got_flag:#x}, want {want_flag:#x}")
                    got = f32s(f"{tmp}/out.sums")
                    if grouping != "rowwise" and dirs == "both" and rows * cols:
                        bad += sums_differ(got, block_sums(xs, rows, cols))
                    elif len(got):
                        bad.append("column sums written where none were asked")
                    tally.add(f"{grouping} {dtype} pow2={pow2} [{rows}, {cols}] {dirs}", bad)
            print(f"{grouping} {dtype}: {tally.so_far()} so far")
    # A NaN or an Inf reaches the flag, which the host's finite check reads.
    for grouping in ["rowwise", "block", "tiles"]:
        for bad_v, want in [(float("nan"), "nan"), (float("inf"), "inf")]:
            x = awkward(130, 300, 5)
            x[129 * 300 + 257] = bad_v
            open(f"{tmp}/x.raw", "wb").write(x.tobytes())
            subprocess.run([exe, f"{tmp}/x.raw", "f32", "130", "300", grouping, "0", "both", f"{tmp}/out"], check=True)
            f = array.array("I", open(f"{tmp}/out.flag", "rb").read())[0]
            ok = f > 0x7F800000 if want == "nan" else f == 0x7F800000
            tally.add(f"{grouping} {want} in the input", [] if ok else [f"flag {f:#x}"])
    tally.finish()


if __name__ == "__main__":
    main()
