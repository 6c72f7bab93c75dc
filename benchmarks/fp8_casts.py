"""What the fused encoder's FP8 casts cost: its row-wise cast kernels against the bf16 kernels they
extend and against torch's own amax + scale + cast, per call and in bandwidth.

    python benchmarks/fp8_casts.py [--tokens 32768] [--widths 768,3072,4096] [--warps 4,8,16]

Rows (each at every width, x bf16 [tokens, width]):
- `bias_gelu bf16`: fused_ops.bias_gelu, the kernel encoder=fused runs without FP8;
- `bias_gelu + fp8 rows, W warps`: kernels._bias_gelu_fp8_fwd_kernel (whole rows per program, the
  same output plus its e4m3 rows and scales), at each --warps;
- `rowwise cast, W warps`: kernels._rowwise_fp8_kernel (a pass of its own: read bf16, write e4m3);
- `torch amax + cast`: x.abs().amax(1), x / scale, .to(float8_e4m3fn) in eager PyTorch, the
  unfused way to the same bytes.
GB/s counts the bytes each must move (read x, write y and the e4m3 copy), not what it does move.
Per call: cuda_timing.cuda_ms (median of 5 x 30 calls back to back).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402
import triton  # noqa: E402
from cuda_timing import cuda_ms  # noqa: E402

from bertaccel.encoder import kernels as K  # noqa: E402
from bertaccel.encoder.fp8_ops import FP8  # noqa: E402
from bertaccel.encoder.fused_ops import _row_tile, bias_gelu  # noqa: E402


def rows(tokens: int, width: int, warps: List[int]) -> List[str]:
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    q = torch.empty(x.shape, device="cuda", dtype=FP8)
    s = torch.empty(tokens, device="cuda", dtype=torch.float32)
    block_r, block_d, _ = _row_tile(tokens, width, x.device)
    grid = (triton.cdiv(tokens, block_r),)
    mb = x.numel() / 1e6  # MB per byte of element size
    cases = [("bias_gelu bf16", lambda: bias_gelu(x, bias), 4 * mb)]
    for w in warps:
        cases.append((f"bias_gelu + fp8 rows, {w} warps", lambda w=w: K._bias_gelu_fp8_fwd_kernel[grid](
            x, bias, y, q, s, tokens, width, BLOCK_R=block_r, BLOCK_D=block_d, NATIVE=True, num_warps=w), 5 * mb))
    # The rounding done in fp32 arithmetic (fp8_kernels._e4m3, what Triton's interpreter needs) at the
    # widest warp count: what the GPU's own converter (NATIVE, the default on CUDA) saves.
    cases.append((f"bias_gelu + fp8 rows, fp32-emulated rounding, {max(warps)} warps",
                  lambda: K._bias_gelu_fp8_fwd_kernel[grid](x, bias, y, q, s, tokens, width, BLOCK_R=block_r,
                                                            BLOCK_D=block_d, NATIVE=False, num_warps=max(warps)),
                  5 * mb))
    for w in warps:
        cases.append((f"rowwise cast, {w} warps", lambda w=w: K._rowwise_fp8_kernel[grid](
            x, q, s, tokens, width, BLOCK_R=block_r, BLOCK_D=block_d, NATIVE=True, num_warps=w), 3 * mb))

    def torch_cast() -> None:
        amax = x.abs().amax(1, keepdim=True).float()
        (x / (amax / 448.0)).to(FP8)

    cases.append(("torch amax + cast", torch_cast, 3 * mb))
    out = []
    for name, fn, megabytes in cases:
        ms = cuda_ms(fn)
        out.append(f"| {tokens}x{width} | {name} | {ms:.3f} | {megabytes / ms:.0f} |")
        print(out[-1], flush=True)
    return out


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--widths", default="768,3072,4096")
    ap.add_argument("--warps", default="4,8,16")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fp8_casts.py needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}\n| x | kernel | ms/call | GB/s |\n|---|---|---|---|", flush=True)
    for width in map(int, args.widths.split(",")):
        rows(args.tokens, width, [int(w) for w in args.warps.split(",")])


if __name__ == "__main__":
    main()
