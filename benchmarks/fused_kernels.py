"""encoder=fused's kernels against the best standard way to compute the same thing, one table.

    python benchmarks/fused_kernels.py [--tokens 4096,32768] [--hidden 768] [--intermediate 3072]
        [--programs-per-sm 4] [--tile 2048]

Per op and token count (bf16 activations, fp32 parameters as under autocast, dropout 0.1, training):
forward and forward+backward GPU ms (each captured in a CUDA graph and replayed: the host's launch
cost left out; encoder=fused pays it eagerly, not under compile.step_graph), for
- ours: bertaccel.encoder.fused_ops (bias+GELU; bias+dropout+residual+LayerNorm) and our Triton
  attention over the packed [T, 3, H, D] projection;
- eager: the same arithmetic as PyTorch ops (what Hugging Face's layer runs);
- compiled: that PyTorch code under torch.compile (Inductor fuses it into Triton kernels of its own);
- for attention, torch's varlen flash kernel (what attention=sdpa runs in the fused layer).
GB/s: the bytes the op must move at least (inputs read once, outputs written once), over its time.
--programs-per-sm / --tile override fused_ops' launch geometry, for tuning (the table says which).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bertaccel.encoder import fused_ops as FO  # noqa: E402


def timed_ms(fn: Callable[[], object], reps: int) -> float:
    """GPU time of one call: the call captured in a CUDA graph, the graph replayed `reps` times
    between two events, median of 5 such blocks. Timing eager calls would time the host instead
    at these sizes (a launch costs the host more than most of these kernels cost the GPU), and
    every implementation here is capturable."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # JIT, autotuning and the allocator before capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def fwd_bwd(op: Callable[..., torch.Tensor], inputs: List[torch.Tensor]) -> Callable[[], None]:
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]

    def run():
        out = op(*inputs)
        # autograd.grad, not backward: nothing accumulates into .grad across graph replays
        torch.autograd.grad(out, leaves, torch.ones_like(out))
    return run


def fwd(op: Callable[..., torch.Tensor], inputs: List[torch.Tensor]) -> Callable[[], None]:
    def run():
        with torch.no_grad():
            op(*inputs)
    return run


def ops(hidden: int, p: float) -> Dict[str, Dict[str, Callable]]:
    def ln_eager(x, b, r, w, lb):
        return F.layer_norm(F.dropout(x + b, p, True) + r, (hidden,), w, lb, 1e-12).to(x.dtype)

    def gelu_eager(x, b):
        return F.gelu(x + b)

    return {
        "bias+dropout+residual+LayerNorm": {
            "ours": lambda x, b, r, w, lb: FO.bias_dropout_residual_layernorm(x, b, r, w, lb, p, 1e-12),
            "eager": ln_eager, "compiled": torch.compile(ln_eager)},
        "bias+GELU": {"ours": FO.bias_gelu, "eager": gelu_eager, "compiled": torch.compile(gelu_eager)},
    }


def attention_ops(p: float) -> Dict[str, Callable]:
    from bertaccel.attention.packing import Packing
    from bertaccel.encoder.attention import core

    def make(core):
        def run(qkv, cu, max_len):
            packing = Packing(None, cu, max_len, cu.shape[0] - 1, max_len)
            return core(qkv, packing, p, qkv.shape[-1] ** -0.5)
        return run

    return {"ours (Triton)": make(core("triton")), "torch varlen flash": make(core("sdpa"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="4096,32768")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128, help="sequence length of the attention rows (T / seq sequences)")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--programs-per-sm", type=int)
    ap.add_argument("--tile", type=int)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this benchmark times GPU kernels; no CUDA GPU is visible", file=sys.stderr)
        return 2
    if a.programs_per_sm:
        FO.PROGRAMS_PER_SM = a.programs_per_sm
    if a.tile:
        FO.TILE_ELEMENTS = a.tile
    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    print(f"{torch.cuda.get_device_name(dev)}; torch {torch.__version__}; PROGRAMS_PER_SM={FO.PROGRAMS_PER_SM} "
          f"TILE_ELEMENTS={FO.TILE_ELEMENTS}; bf16 activations, fp32 parameters, dropout {a.dropout}")
    print("| op | T | impl | fwd ms | fwd+bwd ms | fwd+bwd GB/s |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, dtype=bf16):
        return torch.randn(*shape, generator=g, device=dev, dtype=dtype).requires_grad_()

    for tokens in [int(t) for t in a.tokens.split(",")]:
        d, i = a.hidden, a.intermediate
        cases = {
            "bias+dropout+residual+LayerNorm": ([rand(tokens, d), rand(d, dtype=torch.float32), rand(tokens, d),
                                                 rand(d, dtype=torch.float32), rand(d, dtype=torch.float32)],
                                                # read x, r, dy; write y, dx, dr (+ xhat saved): 7 x T x D x 2 bytes
                                                7 * tokens * d * 2),
            "bias+GELU": ([rand(tokens, i), rand(i, dtype=torch.float32)], 4 * tokens * i * 2),  # x, dy, y, dx
        }
        for name, impls in ops(d, a.dropout).items():
            inputs, nbytes = cases[name]
            for impl, op in impls.items():
                try:
                    f_ms = timed_ms(fwd(op, inputs), a.reps)
                    fb_ms = timed_ms(fwd_bwd(op, inputs), a.reps)
                except Exception as e:  # noqa: BLE001 - one implementation that cannot be captured is a row
                    print(f"| {name} | {tokens} | {impl} | failed: {str(e).splitlines()[0][:120]} | | |", flush=True)
                    continue
                print(f"| {name} | {tokens} | {impl} | {f_ms:.3f} | {fb_ms:.3f} | {nbytes / fb_ms / 1e6:.0f} |",
                      flush=True)
        n_seq = max(1, tokens // a.seq)
        cu = torch.arange(0, (n_seq + 1) * a.seq, a.seq, dtype=torch.int32, device=dev)
        qkv = rand(n_seq * a.seq, 3, a.heads, d // a.heads)
        for impl, op in attention_ops(a.dropout).items():
            f_ms = timed_ms(fwd(op, [qkv, cu, a.seq]), a.reps)
            fb_ms = timed_ms(fwd_bwd(lambda t: op(t, cu, a.seq), [qkv]), a.reps)
            print(f"| attention, S={a.seq} | {tokens} | {impl} | {f_ms:.3f} | {fb_ms:.3f} | - |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
