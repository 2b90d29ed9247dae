"""PyTorch's FP8 rowwise linear, the peer of the `fp8_rowwise` recipe
(issue 18): forward and backward of y = x W^T at a Flux linear's shape,
every GEMM through torch._scaled_mm with per-row scales along its reduction
axis (E4M3 everywhere, power-of-two scales as torchao's rowwise recipe),
beside BF16 F.linear in the same run, eager and torch.compile.

    python bench/fp8_rowwise_peer.py [--m 16384] [--k 3072] [--n 12288]

Prints the median time of each and its ratio to BF16 F.linear (forward +
backward). Quantization (amax, scale, cast) is inside the timed region, as
it is in a training step.
"""

import argparse
import statistics

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max


def rowwise(t, dim):
    """E4M3 codes of `t` with one power-of-two scale per slice along `dim`
    (SPEC 3b), and the inverse scales _scaled_mm multiplies by."""
    amax = t.abs().amax(dim=dim, keepdim=True).float().clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2(E4M3_MAX / amax)))
    q = (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale.reciprocal()


def fp8_linear_fwd_bwd(x, w, dy):
    # fprop: y = x W^T, both along K.
    y = fp8_fwd(x, w)
    # dgrad: dx = dy W, along N.
    dyq, sdy = rowwise(dy, 1)  # [M, N], scales [M, 1]
    wtq, swt = rowwise(w.t().contiguous(), 1)  # [K, N]: per row k along N, scales [K, 1]
    dx = torch._scaled_mm(dyq, wtq.t(), scale_a=sdy, scale_b=swt.t(), out_dtype=torch.bfloat16)
    # wgrad: dW = dy^T x, along M.
    dytq, sdyt = rowwise(dy.t().contiguous(), 1)  # [N, M], scales [N, 1]
    xtq, sxt = rowwise(x.t().contiguous(), 1)  # [K, M], scales [K, 1]
    dw = torch._scaled_mm(dytq, xtq.t(), scale_a=sdyt, scale_b=sxt.t(), out_dtype=torch.bfloat16)
    return y, dx, dw


def fp8_fwd(x, w):
    xq, sx = rowwise(x, 1)
    wq, sw = rowwise(w, 1)
    return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16)


def bf16_linear_fwd_bwd(x, w, dy):
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    y = F.linear(x, w)
    y.backward(dy)
    return y, x.grad, w.grad


def median_ms(f, *args, reps=20, rounds=7):
    for _ in range(3):
        f(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            f(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=3072)
    ap.add_argument("--n", type=int, default=12288)
    a = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(a.m, a.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(a.n, a.k, device="cuda", dtype=torch.bfloat16) * 0.02
    dy = torch.randn(a.m, a.n, device="cuda", dtype=torch.bfloat16) * 1e-3
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, M={a.m} K={a.k} N={a.n}")

    # The FP8 result is close to BF16's (a check that the layouts are right).
    yf, dxf, dwf = fp8_linear_fwd_bwd(x, w, dy)
    yb, dxb, dwb = bf16_linear_fwd_bwd(x, w, dy)
    for name, got, want in [("y", yf, yb), ("dx", dxf, dxb), ("dw", dwf, dwb)]:
        rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
        print(f"fp8 rowwise {name}: relative error against BF16 {rel:.2e}")

    base = median_ms(bf16_linear_fwd_bwd, x, w, dy)
    base_fwd = median_ms(F.linear, x, w)
    rows = [
        ("BF16 F.linear fwd+bwd (eager)", base, base),
        ("FP8 rowwise fwd+bwd (eager)", median_ms(fp8_linear_fwd_bwd, x, w, dy), base),
        ("FP8 rowwise fwd+bwd (torch.compile)", median_ms(torch.compile(fp8_linear_fwd_bwd), x, w, dy), base),
        ("BF16 F.linear fwd", base_fwd, base_fwd),
        ("FP8 rowwise fwd (torch.compile)", median_ms(torch.compile(fp8_fwd), x, w), base_fwd),
    ]
    for name, ms, ref in rows:
        print(f"{name:40s} {ms:8.3f} ms   {ref / ms:5.2f}x BF16")


if __name__ == "__main__":
    main()
