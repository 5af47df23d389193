#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention timed on the shape of tools/gpu-check.sh's attention row (the CUDA backend's
tensor-core and reference kernels are timed by tests/gpu/cuda_throughput_test.cpp, CudaAttentionTiming).

    python3 bench/sdpa_cuda.py [--batch 16] [--heads 12] [--head-dim 64] [--sequence 1024] [--not-causal]

Prints one line, "SDPA batch=... forward_ms=F forward_backward_ms=FB": medians of 5 windows of 5 calls
after a warm-up, bf16 on CUDA, CUDA events around each window. Inputs are (batch, heads, sequence, head_dim), as
hpctrain's packed qkv is after its split and view (the transposes are not timed, nor hpctrain's).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--sequence", type=int, default=1024)
    parser.add_argument("--not-causal", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_cuda.py: no CUDA device for torch")
    shape = (args.batch, args.heads, args.sequence, args.head_dim)
    generator = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.rand(shape, device="cuda", dtype=torch.bfloat16, generator=generator).mul_(4).sub_(2)
               .requires_grad_() for _ in range(3))
    dout = torch.rand(shape, device="cuda", dtype=torch.bfloat16, generator=generator).mul_(2).sub_(1)
    causal = not args.not_causal

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def forward_backward():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(dout)

    def median_ms(work):
        work()
        windows = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                work()
            end.record()
            torch.cuda.synchronize()
            windows.append(start.elapsed_time(end) / 5)
        return statistics.median(windows)

    forward_ms, both_ms = median_ms(forward), median_ms(forward_backward)
    print(f"SDPA batch={args.batch} heads={args.heads} head_dim={args.head_dim} sequence={args.sequence} "
          f"causal={int(causal)} forward_ms={forward_ms:.3f} forward_backward_ms={both_ms:.3f}")


if __name__ == "__main__":
    main()
