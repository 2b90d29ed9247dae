#!/usr/bin/env python3
"""
Golden vectors for FP8 rowwise and 128-block scaling (SPEC section 3b):
section 3's tensorwise rule applied per group, always E4M3FN.

  amax   = max |x| over the group (zero padding never raises it)
  scale  = fl32(448 / max(amax, 1e-12))   (the f64 quotient rounded once to f32,
           torchao's amax_to_scale); with pow2 rounded down to a power of two
  q      = satfinite RNE to E4M3FN of fl32(x * scale)
  scale_inv = fl32(1 / scale); dequantized = fl32(decode(q) * scale_inv)

Groups: rowwise = one per row of the axis-last view (a [rows, len] tensor
quantized along its last axis); 128-block = one per 128 consecutive elements
of a row zero-padded to a multiple of 128, and with tile2d one per 128 x 128
tile (rows 128t..128t+127, one block column), stored for each of its blocks.

Only numpy + ml_dtypes are needed. The E4M3FN encoder is written from first
principles (exact float64 comparisons on the exact f32 value, ties to the
even code) and cross-checked against ml_dtypes on every element.

Usage:  python gen_golden_groups.py [OUTDIR]     (default: beside this script)
Writes fp8_rowwise.json and fp8_block.json.
"""
import json
import os
import sys

import ml_dtypes as md
import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
F32 = np.float32
E4M3_MAX = 448.0
BLOCK = 128

# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def f32_bits(x):
    return int(np.asarray(x, dtype=np.float32).reshape(1).view(np.uint32)[0])


def hex32(x):
    """f32 value -> '0x%08x' of its bits (NaN as 0x7fc00000, never expected here)."""
    if np.isnan(x):
        return "0x7fc00000"
    return "0x%08x" % f32_bits(x)


def hex_rows(a):
    """2-D f32 array -> list of rows of bit strings."""
    return [[hex32(v) for v in row] for row in np.asarray(a, dtype=np.float32)]


def code_rows(c):
    return [["0x%02x" % int(v) for v in row] for row in c]


def to_json(o, ind=0):
    """JSON with one line per list of scalars (a row), indent 1 otherwise."""
    sp = " " * ind
    if isinstance(o, dict):
        if not o:
            return "{}"
        inner = ",\n".join('%s %s: %s' % (sp, json.dumps(k), to_json(v, ind + 1)) for k, v in o.items())
        return "{\n" + inner + "\n" + sp + "}"
    if isinstance(o, list) and any(isinstance(v, (dict, list)) for v in o):
        inner = ",\n".join(sp + " " + to_json(v, ind + 1) for v in o)
        return "[\n" + inner + "\n" + sp + "]"
    return json.dumps(o)


# ----------------------------------------------------------------------------
# E4M3FN from first principles
# ----------------------------------------------------------------------------


def e4m3_decode_code(c):
    """Exact value of an E4M3FN code (bias 7, no Inf, S.1111.111 NaN)."""
    s = -1.0 if c & 0x80 else 1.0
    e = (c >> 3) & 0xF
    m = c & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (1 + m / 8.0) * 2.0 ** (e - 7)


E4M3_VALS = np.array([e4m3_decode_code(c) for c in range(0x7F)])  # codes 0..0x7e, increasing
E4M3_DECODE_F32 = np.array([e4m3_decode_code(c) for c in range(256)], dtype=np.float32)


def e4m3_encode(x):
    """Satfinite RNE of f32 values to E4M3FN codes (uint8); the sign of zero is kept."""
    x = np.asarray(x, dtype=np.float32)
    assert not np.isnan(x).any(), "no NaN reaches the FP8 group encoder"
    neg = np.signbit(x)
    a = np.abs(x.astype(np.float64))  # exact
    a = np.minimum(a, E4M3_MAX)  # +-Inf and overflow saturate
    i = np.searchsorted(E4M3_VALS, a, side="right") - 1  # E4M3_VALS[i] <= a
    i = np.clip(i, 0, len(E4M3_VALS) - 1)
    lo = E4M3_VALS[i]
    hi = E4M3_VALS[np.minimum(i + 1, len(E4M3_VALS) - 1)]
    dlo, dhi = a - lo, hi - a  # exact in f64
    up = (dhi < dlo) | ((dhi == dlo) & (i % 2 == 1))
    up &= a != lo
    code = (i + up.astype(np.int64)).astype(np.uint8)
    code = np.where(neg, code | 0x80, code).astype(np.uint8)
    # Cross-check: ml_dtypes' RNE cast of the clipped value (satfinite == clip then RNE).
    ref = np.clip(x, -E4M3_MAX, E4M3_MAX).astype(md.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(ref, code), "E4M3 encoder disagrees with ml_dtypes"
    return code


# ----------------------------------------------------------------------------
# the reference of SPEC 3b
# ----------------------------------------------------------------------------


def amax_to_scale(amax, pow2):
    """torchao amax_to_scale: fl32(float64(448) / max(float64(amax), 1e-12)); pow2 clears the
    23 mantissa bits (== torchao's exp2(floor(log2(scale))) for these normal scales)."""
    a = np.asarray(amax, dtype=np.float32).astype(np.float64)
    s = (np.float64(E4M3_MAX) / np.maximum(a, 1e-12)).astype(np.float32)
    if pow2:
        p = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
        assert np.array_equal(p, np.exp2(np.floor(np.log2(s.astype(np.float64)))).astype(np.float32))
        s = p
    return s


def quantize_groups(x, rowwise, tile2d, pow2):
    """x: [rows, len] f32, quantized along the last axis."""
    x = np.asarray(x, dtype=np.float32)
    assert np.isfinite(x).all()
    rows, n = x.shape
    if rowwise:
        padded, glen, gpr = n, n, 1
    else:
        padded = -(-n // BLOCK) * BLOCK
        glen, gpr = BLOCK, padded // BLOCK
    p = np.zeros((rows, padded), np.float32)
    p[:, :n] = x
    if rowwise:
        amax = (np.abs(p).max(axis=1, initial=0.0)).reshape(rows, 1).astype(np.float32)
    else:
        amax = np.abs(p).reshape(rows, gpr, BLOCK).max(axis=2, initial=0.0).astype(np.float32)
    if tile2d:
        t = amax.copy()
        for r0 in range(0, rows, BLOCK):
            r1 = min(r0 + BLOCK, rows)
            t[r0:r1, :] = amax[r0:r1, :].max(axis=0)
        amax = t
    scale = amax_to_scale(amax, pow2)
    scale_inv = (np.float32(1.0) / scale).astype(np.float32)
    per_elem = np.repeat(scale, glen, axis=1) if gpr and glen else np.zeros((rows, padded), np.float32)
    per_inv = np.repeat(scale_inv, glen, axis=1) if gpr and glen else np.zeros((rows, padded), np.float32)
    with np.errstate(over="ignore"):
        q = (p * per_elem).astype(np.float32)
        codes = e4m3_encode(q)
        codes[:, n:] = 0
        deq = (E4M3_DECODE_F32[codes] * per_inv).astype(np.float32)
    return {
        "padded_len": padded,
        "group_len": glen,
        "amax_f32_bits": hex_rows(amax),
        "scales_f32_bits": hex_rows(scale),
        "scale_inv_f32_bits": hex_rows(scale_inv),
        "codes": code_rows(codes[:, :n]),
        "dequantized_f32_bits": hex_rows(deq[:, :n]),
        "saturated": int(np.sum(np.abs(q[:, :n]) > E4M3_MAX)),
    }


# ----------------------------------------------------------------------------
# vectors
# ----------------------------------------------------------------------------


def first_amax_rounding_above_448():
    """A normal f32 amax for which fl32(amax * fl32(448 / amax)) > 448."""
    rng = np.random.default_rng(11)
    for a in rng.uniform(1.0, 2.0, 10000).astype(np.float32):
        s = amax_to_scale(a, False)
        if np.float32(a * s) > np.float32(448.0):
            return np.float32(a), np.float32(a * s)
    raise AssertionError("no amax found")


def vectors():
    rng = np.random.default_rng(2024)

    def randn(rows, n, scales=None):
        v = rng.standard_normal((rows, n)).astype(np.float32)
        if scales is not None:
            v = (v * np.asarray(scales, np.float32)[:, None]).astype(np.float32)
        return v

    out = []
    out.append(("len1", "one element, -3.5: the scale makes it -448", np.array([[-3.5]], np.float32)))
    out.append(("len17", "2 rows of 17 N(0,1) values", randn(2, 17)))
    for n in (127, 128, 129, 300):
        out.append(("len%d" % n, "3 rows of %d N(0,1) values scaled by 1, 1e-3 and 50" % n,
                    randn(3, n, [1.0, 1e-3, 50.0])))

    z = randn(3, 40)
    z[0, :] = 0.0
    z[0, 1::3] = -0.0
    z[1, 5] = 0.0
    z[1, 6] = -0.0
    z[2, :] = -0.0
    out.append(("zeros_and_negative_zero", "row 0 all zeros (some -0.0), row 1 N(0,1) with a 0 and a -0.0, "
                "row 2 all -0.0: an all-zero group gets scale 448 / 1e-12 and its codes keep the sign of zero", z))

    sub = np.zeros((4, 140), np.float32)
    sub[0] = (np.arange(1, 141, dtype=np.uint32) * np.uint32(0x3001)).view(np.float32)  # f32 subnormals
    sub[0, ::4] *= -1
    sub[1] = randn(1, 140)[0] * np.float32(1e-30)
    sub[2] = randn(1, 140)[0] * np.float32(1e-13)
    sub[2, 7] = np.float32(1e-12)  # just below the f64 1e-12 clamp (1e-12 is not an f32)
    sub[3] = randn(1, 140)[0] * np.float32(1e-12)
    sub[3, 3] = np.float32(2e-12)
    out.append(("tiny", "row 0 f32 subnormals, row 1 ~1e-30, row 2 amax fl32(1e-12) < 1e-12 (clamped: "
                "scale 448/1e-12), row 3 amax 2e-12 (an exact scale); most codes underflow to +-0", sub))

    h = randn(2, 130, [1e37, 1e36])
    h[0, 0] = np.float32(3.4028235e38)
    h[0, 129] = np.float32(-1.7014117e38)
    h[1, 64] = np.float32(-3.4028235e38)
    out.append(("near_f32_max", "amax = f32 max: scale 448/3.4e38 = 1.3e-36 (2^-121 with pow2) and scale_inv "
                "about 7.6e35, so 448 * scale_inv may overflow f32 on dequantization", h))

    a448, q448 = first_amax_rounding_above_448()
    r = randn(2, 130)
    r[0] = np.clip(r[0], -1.0, 1.0)
    r[0, 10] = a448
    r[0, 11] = -a448
    r[1] = randn(1, 130)[0] * np.float32(1e5)
    r[1, 0] = np.float32(1e6)
    r[1, 1] = np.float32(448.0)
    r[1, 2] = np.float32(464.0)
    out.append(("above_448", "row 0: amax %s for which fl32(amax * scale) = %s > 448 (satfinite to 448 "
                "in the exact mode); row 1: values up to 1e6, scale < 1" % (repr(float(a448)), repr(float(q448))), r))

    o = randn(2, 300)
    o[0, 200] = np.float32(1e4)
    o[1, 5] = np.float32(-3e3)
    out.append(("outliers", "N(0,1) with a 1e4 outlier in row 0 (block 1) and -3e3 in row 1 (block 0): "
                "rowwise scales shrink the whole row, 128-blocks only the outlier's block", o))

    ties = np.zeros((1, 160), np.float32)
    vals = [448.0, 1.0625, 1.1875, 17.0, 19.0, 272.0, 304.0, 2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10,
            np.nextafter(F32(1.0625), F32(2)), np.nextafter(F32(1.0625), F32(0)), 240.0, -1.0625,
            -0.0, 7 * 2.0 ** -10, 15 * 2.0 ** -10]
    ties[0, :len(vals)] = np.array(vals, np.float32)
    ties[0, 140:150] = np.array(vals[1:11], np.float32) * np.float32(-1)
    out.append(("e4m3_ties", "amax 448 so the scale is exactly 1 in both modes: exact E4M3 ties (1.0625, 17, "
                "272, 3*2^-10, ...) and their f32 neighbours, positive and negative (tests RNE and subnormals)", ties))
    return out


def tile_vector():
    rng = np.random.default_rng(77)
    x = (rng.standard_normal((129, 130)) * np.float32(0.5)).astype(np.float32)
    x[128, 3] = np.float32(90.0)  # tile (1, 0): the one-row tile
    x[20, 129] = np.float32(-40.0)  # tile (0, 1): the two-column tile
    x[7, 7] = np.float32(1e-3)
    return ("tiles_129x130", "129 x 130: tiles (0,0) 128x128, (0,1) 128x2, (1,0) 1x128, (1,1) 1x2, with "
            "outliers -40 in tile (0,1) and 90 in tile (1,0)", x)


def entry(name, desc, x, modes):
    x = np.asarray(x, np.float32)
    e = {"name": name, "description": desc, "rows": int(x.shape[0]), "len": int(x.shape[1]),
         "input_f32_bits": hex_rows(x)}
    for key, (rowwise, tile2d, pow2) in modes.items():
        e[key] = quantize_groups(x, rowwise, tile2d, pow2)
    return e


ALGORITHM = {
    "layout": "each vector is the axis-last view [rows, len] of a tensor quantized along its last axis",
    "amax": "max |x| over the group in f32; padding zeros never raise it; no NaN or Inf appears (SPEC 3b refuses them)",
    "scale": "fl32(float64(448) / max(float64(amax), 1e-12)) (torchao amax_to_scale); pow2: the 23 mantissa "
             "bits cleared (round down to a power of two)",
    "codes": "satfinite RNE to E4M3FN of fl32(x * scale) (the sign of zero kept), [rows, len]: the real "
             "elements only; the codes of the padding (columns len..padded_len) are 0x00",
    "scale_inv": "fl32(1 / scale) per group",
    "dequantized": "fl32(decode(code) * scale_inv), [rows, len]; the padding dequantizes to +0",
    "saturated": "number of real elements with |fl32(x * scale)| > 448 (clipped to 448 by satfinite)",
    "value_encoding": "every f32 is the hex string of its IEEE-754 bits; codes are hex bytes",
}


def main():
    os.makedirs(OUT, exist_ok=True)
    vs = vectors()
    rowwise = {
        "description": "FP8 E4M3FN rowwise scaling (SPEC 3b): one scale per row of the axis-last view. "
                       "Modes: 'pow2' (the default of the fp8_rowwise recipe) and 'exact' (pow2 = false). "
                       "Scales are [rows, 1]; codes and dequantized values [rows, len] (no padding).",
        "generator": "gen_golden_groups.py",
        "numpy": np.__version__,
        "ml_dtypes": md.__version__,
        "algorithm": ALGORITHM,
        "vectors": [entry(n, d, x, {"pow2": (True, False, True), "exact": (True, False, False)}) for n, d, x in vs],
    }
    block_modes = {"exact": (False, False, False), "pow2": (False, False, True),
                   "tile2d_exact": (False, True, False), "tile2d_pow2": (False, True, True)}
    blocks = [entry(n, d, x, block_modes) for n, d, x in vs]
    n, d, x = tile_vector()
    blocks.append(entry(n, d, x, {"tile2d_exact": (False, True, False)}))
    block = {
        "description": "FP8 E4M3FN 128-block scaling (SPEC 3b): one scale per 1x128 block of a row zero-padded "
                       "to a multiple of 128; with tile2d one per 128x128 tile of the [rows, len] matrix "
                       "(rows 128t..128t+127, one block column; the last tiles may be smaller), stored for each "
                       "block it covers. Modes: 'exact' (the default of the fp8_block recipe), 'pow2', "
                       "'tile2d_exact' (the W operand), 'tile2d_pow2'; the last vector, the only one with more "
                       "than 128 rows, has 'tile2d_exact' only. Scales are [rows, padded_len / 128]; codes and "
                       "dequantized values [rows, len].",
        "generator": "gen_golden_groups.py",
        "numpy": np.__version__,
        "ml_dtypes": md.__version__,
        "algorithm": ALGORITHM,
        "vectors": blocks,
    }
    for fname, obj in (("fp8_rowwise.json", rowwise), ("fp8_block.json", block)):
        path = os.path.join(OUT, fname)
        with open(path, "w") as f:
            f.write(to_json(obj) + "\n")
        print("wrote %s (%d vectors)" % (path, len(obj["vectors"])))


if __name__ == "__main__":
    main()
