"""What the kernel checks (check_*.py) share: building a driver, the input
files, the CPU reference run (`mxswitch quantize`), value helpers and the
tally. Only the standard library is needed."""
import argparse
import array
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SHAPES = [(1, 1), (3, 17), (16, 127), (129, 128), (2, 129), (130, 300), (257, 520),
          (1000, 33), (64, 64), (300, 1000), (1283, 77), (256, 384)]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f32(v):
    """v rounded to f32."""
    return array.array("f", [v])[0]


def chunk_sums(xs, rows, cols, groups, chunk_rows=128):
    """The partial column sums of the row-major [rows, cols] xs as a kernel
    takes them: per chunk of `chunk_rows` rows and column, the sum over
    `groups` (in order) of each group's sum over its row offsets in the chunk
    (in order), each from +0 in f32; rows past the matrix add +0."""
    out = []
    for chunk in range((rows + chunk_rows - 1) // chunk_rows):
        for c in range(cols):
            acc = 0.0
            for g in groups:
                s = 0.0
                for i in g:
                    r = chunk_rows * chunk + i
                    s = f32(s + (xs[r * cols + c] if r < rows else 0.0))
                acc = f32(acc + s)
            out.append(acc)
    return out


def sums_differ(got, want):
    """[] when the column sums `got` have the bits of `want`, else one line
    naming the first difference."""
    diff = next((i for i in range(min(len(got), len(want))) if bits(got[i]) != bits(want[i])), None)
    if len(got) == len(want) and diff is None:
        return []
    return [f"column sums: {len(got)} values (want {len(want)}), first difference at {diff}"]


def bf16_bits(v):
    """Round-to-nearest-even f32 -> BF16 bits of a finite f32 value."""
    b = bits(v)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def e4m3(byte):
    """The value of an E4M3FN byte (not NaN)."""
    e, m = (byte >> 3) & 0xF, byte & 7
    v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if byte & 0x80 else v


def values(rows, cols, seed, tiny=False):
    """Gaussian values over a few binades (NVFP4's two-level scales keep
    about 2^17 of range below the tensor amax), with zeros, -0, outliers and
    f32 subnormals; `tiny` scales everything below 2^-120, so that NVFP4's t
    is subnormal and MX operands' products are f32 subnormals."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows * cols):
        k = rng.random()
        if k < 0.05:
            v = 0.0
        elif k < 0.07:
            v = -0.0
        elif k < 0.08:
            v = rng.gauss(0, 1) * 1000
        elif k < 0.09:
            v = rng.choice([1e-40, -3e-42])
        else:
            v = rng.gauss(0, 1) * 2.0 ** rng.randrange(-8, 4)
        out.append(v * 2.0 ** -130 if tiny else v)
    return array.array("f", out)


def write_st(path, data, dtype, shape):
    hdr = json.dumps({"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        out[k] = (v["shape"], raw if v["dtype"] == "U8" else array.array("f", raw))
    return out


def setup(driver):
    """Parses the common options (--mxswitch, --cxx) and builds DRIVER.cpp
    in a fresh temporary folder; returns (args, folder, executable)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--mxswitch", default=os.path.join(ROOT, "target", "release", "mxswitch"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kernel_emu_")
    exe = os.path.join(tmp, driver)
    subprocess.run([args.cxx, "-std=c++20", "-O2", "-ffp-contract=off", "-pthread", "-Wno-unknown-pragmas",
                    "-o", exe, os.path.join(HERE, driver + ".cpp")], check=True)
    return args, tmp, exe


def write_input(tmp, x, dtype, rows, cols):
    """Writes the f32 values x as the `[rows, cols]` input in `dtype` ("f32",
    or "bf16" rounded to nearest even): TMP/x.raw for the driver, TMP/x.st
    for mxswitch. Returns the values the kernels read (BF16 widened)."""
    if dtype == "bf16":
        h = array.array("H", [bf16_bits(v) for v in x])
        raw, st_dtype = h.tobytes(), "BF16"
        x = array.array("f", array.array("I", [v << 16 for v in h]).tobytes())
    else:
        raw, st_dtype = x.tobytes(), "F32"
    open(f"{tmp}/x.raw", "wb").write(raw)
    write_st(f"{tmp}/x.st", raw, st_dtype, [rows, cols])
    return x


def cpu_quantize(args, tmp, opts):
    """`mxswitch quantize OPTS` of TMP/x.st: (its tensors, None), or (None,
    the error) when it fails."""
    p = subprocess.run([args.mxswitch, "quantize", *opts, "--input", f"{tmp}/x.st", "--output", f"{tmp}/cpu.st"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"mxswitch quantize failed: {p.stderr.strip()}"
    return read_st(f"{tmp}/cpu.st"), None


class Tally:
    """Counts the cases, prints each failure, and ends with "N passed, M
    failed" (exit status 1 on any failure)."""

    def __init__(self):
        self.passed = self.failed = 0

    def add(self, label, bad):
        if bad:
            self.failed += 1
            print(f"FAIL {label}: " + "; ".join(bad[:5]))
        else:
            self.passed += 1
        sys.stdout.flush()

    def so_far(self):
        return f"{self.passed} passed, {self.failed} failed"

    def finish(self):
        print(self.so_far())
        sys.exit(1 if self.failed else 0)
