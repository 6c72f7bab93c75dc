"""The most a fused FP8 encoder could save: a BERT layer's GEMMs in bf16 against FP8 with the casts free.

    python benchmarks/fp8_gemm_ceiling.py [--models bert_base_random,bert_large_random] [--batch-sizes 32,256]

Issue 47 asks for FP8 inside encoder=fused: its LayerNorm and bias+GELU kernels would write the
FP8 copy of their output in the pass they already make, so the casts torchao pays for
(precision=fp8, docs/accelerations.md) would cost next to nothing. Before building that, this
measures its ceiling: the 12 GEMMs of one encoder layer (Q/K/V, attention output, FFN in and out;
each forward, input gradient and weight gradient) as bf16 `torch.mm` against `torch._scaled_mm`
on FP8 (e4m3) operands made beforehand, in the layouts the FP8 GEMM needs (A row-major, B
column-major), with tensorwise scales. Nothing of a cast, an amax or a transposed copy is timed,
so the FP8 column is a lower bound on any real FP8 layer and `saved` an upper bound on what FP8
GEMMs can take off a step: layer ms x the model's layers.

Per GEMM: the median of 5 repeats of 30 calls back to back (CUDA events, after 10 warm-up
calls). Every figure of one table comes from one process on one GPU.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402
from cuda_timing import cuda_ms  # noqa: E402

SEQ = 128


def layer_gemms(hidden: int, inter: int) -> List[Tuple[str, int, int]]:
    """(name, in features K, out features N) of a BERT layer's four Linear GEMMs (Q/K/V as one)."""
    return [("qkv", hidden, 3 * hidden), ("attention out", hidden, hidden), ("ffn in", hidden, inter),
            ("ffn out", inter, hidden)]


def _fp8(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float8_e4m3fn)


def gemm_ms(tokens: int, k: int, n: int) -> Dict[str, Tuple[float, float]]:
    """{pass: (bf16 ms, fp8 ms)} for y = x W^T (forward), dx = dy W, dW = dy^T x."""
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(tokens, k, device=dev, dtype=bf16)
    w = torch.randn(n, k, device=dev, dtype=bf16) * k ** -0.5
    dy = torch.randn(tokens, n, device=dev, dtype=bf16)
    one = torch.ones((), device=dev, dtype=torch.float32)
    # FP8 operands as a fused kernel would leave them: A row-major [M, K], B column-major [K, N]
    # (the transpose of a row-major [N, K]).
    x8, w8, dy8 = _fp8(x), _fp8(w), _fp8(dy)
    wt8 = _fp8(w.t().contiguous())         # [K, N] row-major: B of dx = dy W is its transpose
    dyt8 = _fp8(dy.t().contiguous())       # [N, T]: A of dW = dy^T x
    xt8 = _fp8(x.t().contiguous())         # [K, T]: B of dW is its transpose

    def scaled(a, b):
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=bf16)

    cases = {"forward": (lambda: torch.mm(x, w.t()), scaled(x8, w8.t())),
             "input grad": (lambda: torch.mm(dy, w), scaled(dy8, wt8.t())),
             "weight grad": (lambda: torch.mm(dy.t(), x), scaled(dyt8, xt8.t()))}
    return {name: (cuda_ms(plain), cuda_ms(fp8)) for name, (plain, fp8) in cases.items()}


def table(model: str, batch: int) -> List[str]:
    from fp8_ffn import model_config

    c = model_config(model)
    tokens = batch * SEQ
    rows = [f"| {model} ({c.hidden_size} wide, {c.num_hidden_layers} layers), B={batch}, S={SEQ} | pass | bf16 ms "
            "| fp8 ms (casts free) | fp8 speed-up |", "|---|---|---|---|---|"]
    total_bf16 = total_fp8 = 0.0
    for name, k, n in layer_gemms(c.hidden_size, c.intermediate_size):
        for pass_, (b, f) in gemm_ms(tokens, k, n).items():
            total_bf16, total_fp8 = total_bf16 + b, total_fp8 + f
            rows.append(f"| {name} [{tokens}x{k}]x[{k}x{n}] | {pass_} | {b:.3f} | {f:.3f} | {b / f:.2f}x |")
    layers = c.num_hidden_layers
    rows.append(f"| one layer, 12 GEMMs | all | {total_bf16:.2f} | {total_fp8:.2f} | {total_bf16 / total_fp8:.2f}x |")
    rows.append(f"| the model's {layers} layers | all | {layers * total_bf16:.1f} | {layers * total_fp8:.1f} | "
                f"saved at most {layers * (total_bf16 - total_fp8):.1f} ms per step |")
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert_base_random,bert_large_random")
    ap.add_argument("--batch-sizes", default="32,256")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        sys.exit("fp8_gemm_ceiling.py needs a CUDA GPU with FP8 tensor cores (sm_89 or newer)")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}", flush=True)
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            print("\n".join(table(model, batch) + [""]), flush=True)


if __name__ == "__main__":
    main()
