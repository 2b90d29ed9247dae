#!/usr/bin/env python3
"""
Golden vectors for NVFP4 two-level block scaling (SPEC section 2b), made with
torchao 0.18's own `nvfp4_quantize` and `per_tensor_amax_to_scale`
(torchao/prototype/mx_formats/nvfp4_tensor.py) and, beside them, an
independent numpy reference of SPEC 2b. Every vector torchao can make is made
both ways and the two must agree bit for bit (tensor scale, block-scale
bytes, packed codes, dequantized values), or the script stops.

SPEC 2b, each step one correctly rounded f32 operation, in this order:
  A = max |x| over the tensor (after the optional Hadamard-16 of SPEC 2)
  t = fl32(A / 2688)                 (t = 1 where that is 0: A = 0, or A <= 2688 * 2^-150)
  per 16-element block (or 16x16 tile) with amax a:
    s   = fl32(fl32(a / 6) / t), clamped to [2^-6, 448], E4M3FN satfinite RNE -> byte; s_q its value
    r   = fl32(fl32(1 / t) / s_q)
    q   = E2M1 satfinite RNE of clamp(fl32(x * r), -6, 6)
    deq = fl32(decode(q) * fl32(t * s_q))
Rows are zero-padded to a multiple of 16; two E2M1 codes a byte, element 2i in
the low nibble.

Vectors torchao cannot make, made by the numpy reference only (each says so
in its "torchao_checked" and "numpy_only_reason" fields):
  - the all-zero tensor: torchao's per_tensor_amax_to_scale gives t = 0 and
    nvfp4_quantize then divides by it (NaN block scales); SPEC 2b sets t = 1;
  - a tensor of tiny f32 subnormals (A <= 2688 * 2^-150): fl32(A / 2688) is
    0 again, and t = 1 as for A = 0 (a 0 / 0 NaN's sign differs between x86
    and CUDA, so the literal result would not even be reproducible);
  - 16x16 tiles: nvfp4_quantize has 1x16 blocks only.
The Hadamard vectors are rotated by this script (SPEC 2's butterfly) and the
rotated rows are what torchao quantizes.

torchao runs on CPU tensors, also on a GPU machine: PyTorch's CUDA division
of a tensor by a Python scalar multiplies by the scalar's reciprocal
(aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu), so on the GPU
`amax / (448 * 6)` and `max_abs / 6` are not the correctly rounded quotients
that SPEC 2b (and torchao on the CPU) compute, and can differ by an ulp.

Usage:
  python gen_golden_nvfp4.py [OUTDIR] [--torchao-path DIR] [--numpy-only]
OUTDIR defaults to the directory of this script. With torch (2.11) and
torchao 0.18.x importable (or torchao unpacked in DIR, e.g. by
`pip install --no-deps --target DIR torchao-0.18.0-*.whl`), the file is made
by both and says "source": "torchao 0.18.x". Without them the script stops,
unless --numpy-only is given: then it writes the numpy reference alone with
"source": "numpy reference of SPEC 2b" (the same bits, if the two agree).
Needs numpy and ml_dtypes (the E2M1 and E4M3FN encoders here are written from
first principles and cross-checked against ml_dtypes).
"""
import argparse
import json
import os
import sys

import ml_dtypes as md
import numpy as np

F32 = np.float32
BLOCK = 16
TENSOR_DIVISOR = F32(2688.0)
MIN_SCALE = F32(2.0 ** -6)
E4M3_MAX = 448.0
E2M1_MAX = 6.0

# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def f32_bits(x):
    return int(np.asarray(x, dtype=np.float32).reshape(1).view(np.uint32)[0])


def hex32(x):
    return "0x7fc00000" if np.isnan(x) else "0x%08x" % f32_bits(x)


def hex_rows(a):
    return [[hex32(v) for v in row] for row in np.asarray(a, dtype=np.float32)]


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
# E4M3FN and E2M1 from first principles
# ----------------------------------------------------------------------------


def decode_code(code, ebits, mbits, bias, fn_nan):
    nbits = 1 + ebits + mbits
    s = -1.0 if (code >> (nbits - 1)) & 1 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if fn_nan and e == (1 << ebits) - 1 and m == (1 << mbits) - 1:
        return float("nan")
    if e == 0:
        return s * m * 2.0 ** (1 - bias - mbits)
    return s * (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias)


E4M3_VALS = np.array([decode_code(c, 4, 3, 7, True) for c in range(0x7F)])
E4M3_DECODE = np.array([decode_code(c, 4, 3, 7, True) for c in range(256)], dtype=np.float32)
E2M1_VALS = np.array([decode_code(c, 2, 1, 1, False) for c in range(8)])  # 0 .. 6
E2M1_DECODE = np.array([decode_code(c, 2, 1, 1, False) for c in range(16)], dtype=np.float32)


def encode_satfinite(x, vals, maxv, signbit):
    """Satfinite RNE of f32 values to the codes whose magnitudes are `vals` (increasing,
    index = code); the sign of zero is kept; NaN gives +0 (only E2M1 may see one)."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    neg = np.signbit(x) & ~nan
    a = np.where(nan, 0.0, np.minimum(np.abs(x.astype(np.float64)), maxv))
    i = np.clip(np.searchsorted(vals, a, side="right") - 1, 0, len(vals) - 1)
    lo, hi = vals[i], vals[np.minimum(i + 1, len(vals) - 1)]
    dlo, dhi = a - lo, hi - a  # exact in f64
    up = ((dhi < dlo) | ((dhi == dlo) & (i % 2 == 1))) & (a != lo)
    code = (i + up).astype(np.uint8)
    return np.where(neg, code | signbit, code).astype(np.uint8)


def e4m3_encode(x):
    x = np.asarray(x, dtype=np.float32)
    assert not np.isnan(x).any()
    c = encode_satfinite(x, E4M3_VALS, E4M3_MAX, 0x80)
    ref = np.clip(x, -E4M3_MAX, E4M3_MAX).astype(md.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(c, ref), "E4M3 encoder disagrees with ml_dtypes"
    return c


def e2m1_encode(x):
    x = np.asarray(x, dtype=np.float32)
    c = encode_satfinite(x, E2M1_VALS, E2M1_MAX, 0x8)
    ok = ~np.isnan(x)
    ref = np.clip(x, -E2M1_MAX, E2M1_MAX).astype(md.float4_e2m1fn).view(np.uint8) & 0xF
    assert np.array_equal(c[ok], ref[ok]), "E2M1 encoder disagrees with ml_dtypes"
    return c


# ----------------------------------------------------------------------------
# the numpy reference of SPEC 2b
# ----------------------------------------------------------------------------


def hadamard16_rows(p):
    """SPEC 2: each group of 16 becomes (1/4) H16 g, as the f32 butterfly h = 1, 2, 4, 8, then * 0.25."""
    g = p.reshape(-1, 16).astype(np.float32).copy()
    h = 1
    while h < 16:
        for i in range(0, 16, 2 * h):
            for j in range(i, i + h):
                a, b = g[:, j].copy(), g[:, j + h].copy()
                g[:, j] = a + b
                g[:, j + h] = a - b
        h *= 2
    g = (g * np.float32(0.25)).astype(np.float32)
    return g.reshape(p.shape)


def prepare(x, hadamard):
    """[rows, len] -> [rows, padded_len] zero-padded (and rotated) f32 rows."""
    rows, n = x.shape
    padded = -(-n // BLOCK) * BLOCK
    p = np.zeros((rows, padded), np.float32)
    p[:, :n] = x
    if hadamard and p.size:
        with np.errstate(over="ignore", invalid="ignore"):
            p = hadamard16_rows(p)
    return p


def nvfp4_numpy(p, tile2d):
    """SPEC 2b on prepared rows p [rows, padded_len]: t, scale bytes [rows, nb], codes [rows, padded_len]."""
    rows, padded = p.shape
    nb = padded // BLOCK
    A = np.float32(np.abs(p).max(initial=0.0))
    assert np.isfinite(A), "non-finite amax: SPEC 2b refuses the tensor"
    t = np.float32(A / TENSOR_DIVISOR)
    if t == 0:
        t = np.float32(1.0)  # A = 0 (SPEC 2b), or f32 subnormals only: torchao would divide by 0
    blocks = p.reshape(rows, nb, BLOCK)
    a = np.abs(blocks).max(axis=2, initial=0.0).astype(np.float32)
    if tile2d:
        tiles = a.copy()
        for r0 in range(0, rows, BLOCK):
            tiles[r0:r0 + BLOCK, :] = a[r0:r0 + BLOCK, :].max(axis=0)
        a = tiles
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = ((a / np.float32(6.0)).astype(np.float32) / t).astype(np.float32)
        s = np.clip(s, MIN_SCALE, np.float32(E4M3_MAX)).astype(np.float32)
        byte = e4m3_encode(s)
        sq = E4M3_DECODE[byte]
        r = ((np.float32(1.0) / t).astype(np.float32) / sq).astype(np.float32)
        q = (blocks * r[:, :, None]).astype(np.float32)
        q = np.clip(q, np.float32(-E2M1_MAX), np.float32(E2M1_MAX)).astype(np.float32)
        codes = e2m1_encode(q).reshape(rows, padded)
        d = (t * sq).astype(np.float32)
        deq = (E2M1_DECODE[codes].reshape(rows, nb, BLOCK) * d[:, :, None]).astype(np.float32)
        saturated = int(np.sum(np.abs((blocks * r[:, :, None]).astype(np.float32)) > E2M1_MAX))
    return {
        "tensor_amax": A,
        "t": t,
        "block_amax": a,
        "scale_bytes": byte,
        "codes": codes,
        "packed": pack(codes),
        "dequantized": deq.reshape(rows, padded),
        "saturated": saturated,
    }


def pack(codes):
    """Element 2i in the low nibble, 2i + 1 in the high one."""
    c = codes.astype(np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


# ----------------------------------------------------------------------------
# torchao
# ----------------------------------------------------------------------------


class Torchao:
    """torchao 0.18.x's nvfp4_quantize on CPU tensors, returning numpy arrays."""

    def __init__(self, path):
        if path:
            sys.path.insert(0, path)
        import torch
        import torchao
        from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

        if not torchao.__version__.startswith("0.18."):
            raise SystemExit("torchao 0.18.x is required, found %s" % torchao.__version__)
        self.torch = torch
        self.version = torchao.__version__
        self.torch_version = torch.__version__
        self.quantize = nvfp4_quantize
        self.amax_to_scale = per_tensor_amax_to_scale
        self.f4_to_f32 = f4_unpacked_to_f32
        self.unpack = unpack_uint4

    def run(self, p):
        torch = self.torch
        x = torch.from_numpy(np.ascontiguousarray(p)).to(device="cpu", dtype=torch.float32)
        amax = torch.max(torch.abs(x))
        t = self.amax_to_scale(amax)
        scales, packed = self.quantize(x, 16, t)
        # torchao's NVFP4Tensor.dequantize: decoded codes * (per_tensor_scale * fl32(scale byte)).
        codes = self.unpack(packed.contiguous().view(torch.uint8))
        values = self.f4_to_f32(codes).view(p.shape[0], -1, BLOCK)
        block = (t * scales.to(torch.float32)).unsqueeze(-1)
        deq = (values * block).view(p.shape)
        return {
            "t": np.float32(t.item()),
            "scale_bytes": scales.view(torch.uint8).numpy().reshape(p.shape[0], -1),
            "packed": packed.view(torch.uint8).numpy().reshape(p.shape[0], -1),
            "dequantized": deq.numpy().astype(np.float32),
        }


def same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def check_against_torchao(name, ref, got):
    problems = []
    if f32_bits(ref["t"]) != f32_bits(got["t"]):
        problems.append("tensor scale %r vs torchao %r" % (float(ref["t"]), float(got["t"])))
    if not np.array_equal(ref["scale_bytes"], got["scale_bytes"]):
        problems.append("scale bytes differ at %s" % np.argwhere(ref["scale_bytes"] != got["scale_bytes"])[:4].tolist())
    if not np.array_equal(ref["packed"], got["packed"]):
        problems.append("packed codes differ at %s" % np.argwhere(ref["packed"] != got["packed"])[:4].tolist())
    if not same_bits(ref["dequantized"], got["dequantized"]):
        problems.append("dequantized values differ")
    if problems:
        raise SystemExit("vector %s: numpy reference and torchao disagree: %s" % (name, "; ".join(problems)))


# ----------------------------------------------------------------------------
# vectors
# ----------------------------------------------------------------------------


def vectors():
    """(name, description, x [rows, len], hadamard, tile2d)"""
    rng = np.random.default_rng(4242)

    def randn(rows, n, scales=None):
        v = rng.standard_normal((rows, n)).astype(np.float32)
        if scales is not None:
            v = (v * np.asarray(scales, np.float32)[:, None]).astype(np.float32)
        return v

    out = []
    out.append(("len1", "one element, -2.5: t = 2.5/2688, s = 448, the element -> code -6", np.array([[-2.5]], np.float32),
                False, False))
    out.append(("len17", "2 rows of 17 N(0,1): each row padded to 32, two blocks", randn(2, 17), False, False))
    for n in (15, 16, 33, 100):
        out.append(("len%d" % n, "3 rows of %d N(0,1) values scaled by 1, 0.01 and 30" % n,
                    randn(3, n, [1.0, 0.01, 30.0]), False, False))

    z = randn(2, 48)
    z[0, 16:32] = 0.0
    z[0, 17] = -0.0
    z[1, 3] = 0.0
    z[1, 4] = -0.0
    out.append(("zeros_in_tensor", "an all-zero block (s = 0 clamps to 2^-6: byte 0x08) holding a -0.0, and "
                "scattered 0 and -0.0 (codes 0x0 and 0x8)", z, False, False))

    out.append(("all_zero_tensor", "every element 0 or -0.0: A = 0, so t = 1 (SPEC 2b; torchao divides by zero), "
                "every block byte 0x08", np.array([[0.0, -0.0] * 10], np.float32), False, False))

    tiny = randn(2, 32)
    tiny[1, :] = (np.arange(1, 33, dtype=np.uint32) * np.uint32(0x1001)).view(np.float32)  # f32 subnormals
    tiny[1, ::3] *= -1
    sub = np.zeros((1, 32), np.float32)
    sub[0, 0] = np.array([0x500], np.uint32).view(np.float32)[0]  # 1280 * 2^-149: A / 2688 < 2^-150
    sub[0, 1] = -np.array([1], np.uint32).view(np.float32)[0]
    sub[0, 20] = np.array([0x200], np.uint32).view(np.float32)[0]
    out.append(("subnormal_tensor", "only f32 subnormals, A = 1280 * 2^-149: fl32(A / 2688) = 0, so t = 1 as for an "
                "all-zero tensor; every block byte 0x08 and every code +-0", sub, False, False))

    out.append(("tiny_elements", "row 0 N(0,1), row 1 f32 subnormals: their block scale clamps to 2^-6 and every "
                "code is +-0", tiny, False, False))

    small = (randn(2, 32) * np.float32(1e-30)).astype(np.float32)
    small[1, 5] = np.float32(3e-45)
    out.append(("tiny_tensor", "A about 3e-30: t = 1.2e-33 is still normal and 1/t finite, so the tensor quantizes "
                "as any other; one f32 subnormal element", small, False, False))

    below = np.abs(randn(1, 16)) * np.float32(1e-37) + np.float32(1e-38)
    below[0, ::2] *= -1
    out.append(("below_range", "A about 3e-37 < 2688 * 2^-128: fl32(1/t) overflows to +Inf, so r = Inf and every "
                "(non-zero) element saturates to +-6 (SPEC 2b followed literally, as torchao does)",
                below.astype(np.float32), False, False))

    huge = randn(2, 32, [1e37, 1e30])
    huge[0, 0] = np.float32(3.4028235e38)
    huge[0, 20] = np.float32(-2.0e38)
    out.append(("near_f32_max", "A = f32 max: t = fl32(A/2688); fl32(t * s_q) * 6 may round past f32 max on "
                "dequantization (-> inf)", huge, False, False))

    o = randn(2, 48)
    o[0, 40] = np.float32(1e6)
    out.append(("outlier_clamps_block_scales", "N(0,1) with one 1e6: t = 372, so every other block's s = a/6/t "
                "is below 2^-6 and clamps there (coarse steps of t * 2^-6)", o, False, False))

    # t = 1 exactly (A = 2688): block scales and elements at exact ties.
    ties = np.zeros((1, 64), np.float32)
    ties[0, 0] = 2688.0  # block 0: s = 448
    ties[0, 16] = 6.375  # block 1: s = 1.0625, an E4M3 tie -> 1.0 (even)
    ties[0, 32] = 7.125  # block 2: s = 1.1875, a tie -> 1.25 (even)
    ties[0, 48] = 6.0  # block 3: s = 1, r = 1: exact E2M1 ties
    ties[0, 49:64] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0,
                               np.nextafter(F32(0.25), F32(1)), np.nextafter(F32(2.5), F32(0)),
                               np.nextafter(F32(5.0), F32(9)), 5.5, -0.0], np.float32)
    ties[0, 17:24] = np.array([1.0, 2.0, 3.0, -4.0, 0.5, 5.9, -6.375], np.float32)
    out.append(("exact_ties", "A = 2688 so t = 1: block scales at E4M3 ties (s = 1.0625 -> 1.0, 1.1875 -> 1.25) and, "
                "under s = 1, elements at exact E2M1 ties and their f32 neighbours", ties, False, False))

    hx = randn(3, 40, [1.0, 0.1, 5.0])
    hx[0, 7] = np.float32(30.0)
    out.append(("hadamard", "3 rows of 40 (padded to 48) with the Hadamard option: the butterfly runs on the padded "
                "rows, so values spread into the padding; both amaxes are taken after it", hx, True, False))

    tx = randn(20, 40, np.linspace(0.1, 3.0, 20))
    tx[3, 35] = np.float32(25.0)
    out.append(("tile2d", "20 x 40 with 16x16 tiles: tile rows 0-15 and 16-19, block columns 0-15, 16-31, 32-47 "
                "(padded); a tile's byte is stored for each of its blocks", tx, False, True))
    return out


NUMPY_ONLY_REASON = {
    "all_zero_tensor": "torchao's per_tensor_amax_to_scale gives t = 0 for A = 0 and nvfp4_quantize divides by it; "
                       "SPEC 2b sets t = 1",
    "subnormal_tensor": "fl32(A / 2688) = 0, so torchao's nvfp4_quantize divides by t = 0; SPEC 2b's t = 1 "
                        "for A = 0 is used",
    "tile2d": "torchao's nvfp4_quantize has 1x16 blocks only (no 16x16 tiles)",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("outdir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--torchao-path", default=os.environ.get("TORCHAO_PATH"),
                    help="directory holding an unpacked torchao 0.18.x (put first on sys.path)")
    ap.add_argument("--numpy-only", action="store_true",
                    help="write the numpy reference alone when torch / torchao cannot be imported")
    args = ap.parse_args()

    ta = None
    try:
        ta = Torchao(args.torchao_path)
    except ImportError as e:
        if not args.numpy_only:
            raise SystemExit("cannot import torch and torchao 0.18.x (%s); install them, pass --torchao-path, "
                             "or pass --numpy-only to write the numpy reference alone" % e)
        print("torch / torchao not importable (%s): writing the numpy reference alone" % e)

    out_vectors = []
    checked = 0
    for name, desc, x, hadamard, tile2d in vectors():
        x = np.asarray(x, np.float32)
        p = prepare(x, hadamard)
        ref = nvfp4_numpy(p, tile2d)
        reason = NUMPY_ONLY_REASON.get(name)
        if ta is not None and reason is None:
            check_against_torchao(name, ref, ta.run(p))
            checked += 1
        rows, n = x.shape
        e = {
            "name": name,
            "description": desc,
            "rows": rows,
            "len": n,
            "padded_len": int(p.shape[1]),
            "hadamard": hadamard,
            "tile2d": tile2d,
            "torchao_checked": ta is not None and reason is None,
        }
        if reason:
            e["numpy_only_reason"] = reason
        e.update({
            "input_f32_bits": hex_rows(x),
            "tensor_amax_f32_bits": hex32(ref["tensor_amax"]),
            "tensor_scale_f32_bits": hex32(ref["t"]),
            "block_amax_f32_bits": hex_rows(ref["block_amax"]),
            "scale_bytes": [["0x%02x" % b for b in row] for row in ref["scale_bytes"]],
            "codes": [["0x%x" % c for c in row] for row in ref["codes"]],
            "packed_bytes": [["0x%02x" % b for b in row] for row in ref["packed"]],
            "dequantized_f32_bits": hex_rows(ref["dequantized"]),
            "saturated": ref["saturated"],
        })
        out_vectors.append(e)

    source = "torchao %s" % ta.version if ta is not None else "numpy reference of SPEC 2b"
    doc = {
        "description": "NVFP4 two-level block scaling (SPEC 2b): 1x16 blocks of E2M1 (or 16x16 tiles) with an "
                       "E4M3FN scale byte each, under one f32 tensor scale.",
        "source": source,
        "generator": "gen_golden_nvfp4.py",
        "torchao": ta.version if ta is not None else None,
        "torch": ta.torch_version if ta is not None else None,
        "numpy": np.__version__,
        "ml_dtypes": md.__version__,
        "vectors_checked_against_torchao": checked,
        "algorithm": {
            "layout": "each vector is the axis-last view [rows, len] of a tensor quantized along its last axis; "
                      "rows are zero-padded to padded_len, a multiple of 16",
            "hadamard": "with hadamard, each group of 16 of the padded rows is first replaced by (1/4) H16 g "
                        "(SPEC 2's f32 butterfly); everything below, the dequantized values included, is in "
                        "that rotated domain",
            "tensor_scale": "A = max |v| over the padded (rotated) rows; t = fl32(A / 2688), and t = 1 where "
                            "that is 0 (A = 0, or only f32 subnormals below 2688 * 2^-150)",
            "block_scale": "a = max |v| over the block (with tile2d: over the 16x16 tile, rows 16k..16k+15 "
                           "and one block column); s = fl32(fl32(a / 6) / t) clamped to [2^-6, 448], then "
                           "E4M3FN satfinite RNE: the byte",
            "codes": "r = fl32(fl32(1 / t) / s_q); code = E2M1 satfinite RNE of clamp(fl32(v * r), -6, 6); "
                     "[rows, padded_len], bit 3 the sign (-0 is 0x8)",
            "packed_bytes": "two codes a byte, element 2i in the low nibble: [rows, padded_len / 2]",
            "dequantized": "fl32(decode(code) * fl32(t * s_q)), [rows, padded_len], rotated domain",
            "saturated": "elements with |fl32(v * r)| > 6 (clipped to 6)",
            "torchao": "nvfp4_quantize(v, 16, per_tensor_amax_to_scale(max |v|)) on CPU tensors, v the padded "
                       "(rotated) rows; its dequantization is NVFP4Tensor.dequantize's: "
                       "f4_unpacked_to_f32(code) * (t * fl32(scale byte))",
            "value_encoding": "every f32 is the hex string of its IEEE-754 bits; codes and bytes are hex",
        },
        "vectors": out_vectors,
    }
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, "nvfp4_blocks.json")
    with open(path, "w") as f:
        f.write(to_json(doc) + "\n")
    print("wrote %s: %d vectors, %d checked against %s" % (path, len(out_vectors), checked,
                                                          source if ta is not None else "nothing (no torchao)"))


if __name__ == "__main__":
    main()
