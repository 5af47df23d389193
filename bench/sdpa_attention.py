"""PyTorch's F.scaled_dot_product_attention on the CPU, the twin of bench/attention_kernels (bench/attention.sh runs
both in alternating rounds).

  sdpa_attention.py --sequence T [--batch 4] [--heads 12] [--head-dim 64] [--dtype fp32|bf16] [--not-causal]
                    [--repeats 20] [--threads N]

Prints one line as attention_kernels does: "forward_ms F forward_backward_ms FB", each the median over the repeats
after 3 warm-up calls. The forward runs under torch.no_grad() (inference: no saved statistics), the forward + backward
with gradients of q, k and v from a random output gradient; q, k, v are (batch, heads, sequence, head_dim) views of one
packed (batch, sequence, 3 x heads x head_dim) tensor, as in a GPT block.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(repeats, call):
    times = []
    for repeat in range(repeats + 3):
        start = time.perf_counter()
        call()
        if repeat >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequence", type=int, required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--not-causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    batch, sequence, heads, dim = args.batch, args.sequence, args.heads, args.head_dim
    torch.manual_seed(1)
    qkv = (torch.rand(batch, sequence, 3 * heads * dim) * 2 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(batch, heads, sequence, dim) * 2 - 1).to(dtype)
    causal = not args.not_causal

    def split(packed):
        q, k, v = packed.split(heads * dim, dim=2)
        return [t.view(batch, sequence, heads, dim).transpose(1, 2) for t in (q, k, v)]

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(*split(qkv), is_causal=causal)

    def forward_backward():
        qkv.grad = None
        out = F.scaled_dot_product_attention(*split(qkv), is_causal=causal)
        out.backward(dout)

    print(f"forward_ms {median_ms(args.repeats, forward):.3f} "
          f"forward_backward_ms {median_ms(args.repeats, forward_backward):.3f}")


if __name__ == "__main__":
    main()
