#!/usr/bin/env python3
"""The multi-tensor AdamW kernel and the gradient norm's kernels (adamw.cu),
run on the CPU through emu.hpp, against references written here from the
kernel's stated arithmetic, bit for bit.

    python3 bench/kernel_emu/check_adamw.py

AdamW: every f32 operation of runtime/src/cpu/adamw.rs in its order (Python
computes each in f64 and rounds to f32, which for +, -, *, / and sqrt of f32
values is the IEEE f32 result), for f32 and BF16 parameters and gradients,
with and without a gradient multiplier, over sizes on both sides of a
thread's step (256) and of a chunk (32768), with fewer CTAs than chunks.
The norm: each chunk's f64 sum as the kernel orders it (thread t adds
elements t, t + 256, ... of the chunk in order, then a fixed tree), then the
chunks likewise in one CTA. Ends with "N passed, M failed" and exits 1 on
any failure. Only the standard library is needed.
"""
import math
import random
import struct
import subprocess

from emu_check import Tally, bf16_bits, bits, f32, setup

THREADS, CHUNK = 256, 32768
SIZES = [1, 255, 256, 257, 513, 2 * CHUNK + 300]


def widen(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def scalars(t):
    """AdamWScalars of step t as f32 values (lr 3e-3, betas 0.9 / 0.95, eps
    1e-8, weight decay 0.1)."""
    lr, b1, b2 = 3e-3, 0.9, 0.95
    return [f32(1 - f32(lr) * f32(0.1)), f32(b1), f32(1 - f32(b1)), f32(b2), f32(1 - f32(b2)),
            f32(lr / (1 - b1 ** t)), f32(math.sqrt(1 - b2 ** t)), f32(1e-8)]


def adamw_ref(w, g, m, v, s, kind, mul):
    """The new (w, m, v) of every element, as f32 values (w BF16-rounded for a
    BF16 parameter)."""
    decay, b1, omb1, b2, omb2, step, bias2, eps = s
    out = ([], [], [])
    for wi, gi, mi, vi in zip(w, g, m, v):
        if kind & 4:
            gi = f32(f32(gi * mul) + 0.0)
            gi = widen(bf16_bits(gi)) if kind & 2 else gi
        wi = f32(wi * decay)
        mi = f32(f32(b1 * mi) + f32(omb1 * gi))
        vi = f32(f32(b2 * vi) + f32(f32(omb2 * gi) * gi))
        wi = f32(wi - f32(f32(step * mi) / f32(f32(f32(math.sqrt(vi)) / bias2) + eps)))
        out[0].append(widen(bf16_bits(wi)) if kind & 1 else wi)
        out[1].append(mi)
        out[2].append(vi)
    return out


def tree(red):
    half = len(red) // 2
    while half:
        for t in range(half):
            red[t] += red[t + half]
        half //= 2
    return red[0]


def sumsq_ref(grads):
    """Each chunk's f64 partial, in the kernel's order, then the total."""
    partial = []
    for g in grads:
        for c in range((len(g) + CHUNK - 1) // CHUNK):
            part = g[c * CHUNK:(c + 1) * CHUNK]
            red = []
            for t in range(THREADS):
                acc = 0.0
                for x in part[t::THREADS]:
                    acc += x * x
                red.append(acc)
            partial.append(tree(red))
    red = []
    for t in range(THREADS):
        acc = 0.0
        for x in partial[t::THREADS]:
            acc += x
        red.append(acc)
    return partial + [tree(red)]


def main():
    _, tmp, exe = setup("adamw")
    tally = Tally()
    rng = random.Random(7)
    for kind in range(8):
        mul = f32(0.37) if kind & 4 else 1.0
        s = scalars(3 + kind)
        params, blob = [], bytearray(struct.pack("<Q", len(SIZES)))
        for n in SIZES:
            blob += struct.pack("<IIQ", kind, bits(mul) if kind & 4 else 0, n) + struct.pack("<8f", *s)
        for n in SIZES:
            w = [rng.gauss(0, 0.05) for _ in range(n)]
            g = [rng.gauss(0, 1) * 2.0 ** rng.randrange(-12, 2) for _ in range(n)]
            m = [f32(rng.gauss(0, 0.01)) for _ in range(n)]
            v = [f32(abs(rng.gauss(0, 1e-4))) for _ in range(n)]
            for vals, is_bf16 in ((w, kind & 1), (g, kind & 2)):
                if is_bf16:
                    h = [bf16_bits(f32(x)) for x in vals]
                    vals[:] = [widen(x) for x in h]
                    blob += struct.pack(f"<{n}H", *h)
                else:
                    vals[:] = [f32(x) for x in vals]
                    blob += struct.pack(f"<{n}f", *vals)
            blob += struct.pack(f"<{n}f", *m) + struct.pack(f"<{n}f", *v)
            params.append((w, g, m, v))
        open(f"{tmp}/in.bin", "wb").write(bytes(blob))
        subprocess.run([exe, f"{tmp}/in.bin", "3", f"{tmp}/out"], check=True)
        got, at, bad = open(f"{tmp}/out.adamw", "rb").read(), 0, []
        for n, (w, g, m, v) in zip(SIZES, params):
            want = adamw_ref(w, g, m, v, s, kind, mul)
            wb = 2 if kind & 1 else 4
            gw = struct.unpack(f"<{n}{'H' if wb == 2 else 'f'}", got[at:at + wb * n])
            gw = [widen(x) for x in gw] if wb == 2 else list(gw)
            at += wb * n
            gm = struct.unpack(f"<{n}f", got[at:at + 4 * n])
            gv = struct.unpack(f"<{n}f", got[at + 4 * n:at + 8 * n])
            at += 8 * n
            for name, gx, wx in (("w", gw, want[0]), ("m", gm, want[1]), ("v", gv, want[2])):
                i = next((i for i in range(n) if bits(gx[i]) != bits(wx[i])), None)
                if i is not None:
                    bad.append(f"n={n} {name}[{i}]: {gx[i]!r}, want {wx[i]!r}")
        raw = open(f"{tmp}/out.sumsq", "rb").read()
        sums = struct.unpack(f"<{len(raw) // 8}d", raw)
        want = sumsq_ref([p[1] for p in params])
        if list(sums) != want:
            i = next((i for i in range(min(len(sums), len(want))) if sums[i] != want[i]), len(want))
            bad.append(f"sum of squares {i} of {len(want)}: "
                       f"{sums[i] if i < len(sums) else None!r}, want {want[i] if i < len(want) else None!r}")
        tally.add(f"kind {kind} (w {'bf16' if kind & 1 else 'f32'}, g {'bf16' if kind & 2 else 'f32'}"
                  f"{', scaled' if kind & 4 else ''})", bad)
    tally.finish()


if __name__ == "__main__":
    main()
