"""Why sdpa can lose to eager attention under dynamic padding: time SDPA forward+backward with a
key-padding mask for sequence lengths that are and are not multiples of 8, per SDPA backend.

    python benchmarks/sdpa_mask_shapes.py        (needs a CUDA GPU)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, D = 32, 12, 64
BACKENDS = {"auto": None, "cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
            "math": [SDPBackend.MATH]}


def step_ms(fn, new_shape_each_call: bool, s: int) -> float:
    """Mean ms of fn over 20 calls; optionally each call with a fresh length (as dynamic padding does)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn(s)
    torch.cuda.synchronize()
    start.record()
    for i in range(20):
        fn(s + (i % 7) if new_shape_each_call else s)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20


def make(backend):
    def run(s):
        q, k, v = (torch.randn(B, H, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mask = torch.ones(B, 1, 1, s, device="cuda", dtype=torch.bool)
        mask[::2, ..., s // 2:] = False  # half the rows padded
        if backend is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.sum().backward()
    return run


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, B={B} H={H} d={D}, fwd+bwd ms")
    print("| backend | S=64 fixed | S=128 fixed | S=57..63 varying |")
    print("|---|---|---|---|")
    for name, backend in BACKENDS.items():
        fn = make(backend)
        cells = []
        for s, vary in ((64, False), (128, False), (57, True)):
            try:
                cells.append(f"{step_ms(fn, vary, s):.2f}")
            except RuntimeError as e:
                cells.append(f"n/a ({str(e).splitlines()[0][:40]})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
