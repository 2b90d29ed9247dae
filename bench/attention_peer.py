#!/usr/bin/env python3
"""PyTorch's fused attention at the shapes of `gpu_check bench attention`.

    python3 bench/attention_peer.py            # on the GPU machine, beside gpu_check

BF16 torch.nn.functional.scaled_dot_product_attention (whichever backend
torch picks, printed), forward alone and forward + backward, medians of
CUDA-event timings; TFLOP/s count 4 b h L^2 d for the forward and 3.5 times
that for forward + backward, as gpu_check does. Run both in one session and
compare the lines (BENCH attention fused ... against PEER attention ...).
"""
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, runs=10, warm=2):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for b, h, l, d in [(2, 24, 4608, 128), (16, 24, 512, 128)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, l, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
        d_o = 1e-2 * torch.randn(b, h, l, d, device="cuda", generator=g, dtype=torch.bfloat16)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        with torch.no_grad():
            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v))

        def both():
            o = F.scaled_dot_product_attention(qg, kg, vg)
            o.backward(d_o)

        fb = median_ms(both)
        flop = 4.0 * b * h * l * l * d
        tf = lambda f, ms: f / (ms * 1e-3) / 1e12
        print(
            f"PEER attention torch B={b} H={h} L={l} D={d} bf16 fwd_ms={fwd:.3f} fwd_tflops={tf(flop, fwd):.1f} "
            f"fwdbwd_ms={fb:.3f} fwdbwd_tflops={tf(3.5 * flop, fb):.1f}"
        )
    backends = [n for n in ("flash", "cudnn", "mem_efficient") if getattr(torch.backends.cuda, f"{n}_sdp_enabled")()]
    print(f"enabled sdpa backends: {', '.join(backends)}")


if __name__ == "__main__":
    main()
