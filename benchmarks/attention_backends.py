"""attention=sdpa vs xformers vs triton, end to end, in one run on one GPU: a training step of the
model bertaccel builds for each option, eager and under compile.step_graph, on full and ragged
batches; then each backend's host cost per attention call.

    python benchmarks/attention_backends.py --imdb .devdata/train.csv.gz

Part 1, training steps (BERT-base shape, random init, bf16 autocast, fused AdamW, clipping):
  workloads "S=128": every row 128 tokens (no padding: all backends run dense, no mask);
  "IMDb<=256": batches of real IMDb reviews' token lengths (truncated to 256, padded to a multiple
  of 8, as the loop's collator does): sdpa pays for the padding in every layer, xformers and
  triton run on the packed tokens (attention/packing.py).
  eager: bertaccel's eager micro-step (train/forward.py's model_inputs: no mask on full batches);
  step_graph: bertaccel's StepGraphs (train/step_graph.py), the whole step replayed.
  Each cell: median ms/step over --steps steps after --warmup (enqueued back to back, timed with
  CUDA events), samples/s = B / step, and the ratio to sdpa's samples/s in the same row.
Part 2, host cost per attention call (fwd+bwd, tiny tensors so the GPU waits on the host):
  what each backend's Python, checks, dispatch and per-batch mask building cost per call.
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import gc
import gzip
import io
import json
import pstats
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEV = torch.device("cuda")
# "sdpa [B,1,1,S]": the same sdpa with its mask handed over as a [B, 1, 1, S] key-padding mask
# (attention/packing.py's pass-through) and every backend allowed. Hugging Face's own sdpa mask
# reached the kernels with stride 0 on its last dimension under CUDA-graph capture, which no fused
# kernel takes ("All fused kernels require the last dimension of the input to have stride 1"):
# attention=sdpa's step graphs ran the MATH backend in fp32. This row is the sdpa a graph can use.
ATTENTIONS = ("sdpa", "sdpa [B,1,1,S]", "xformers", "triton")


def compose(overrides: List[str]):
    from vs_hf_bertaccel import compose as compose_config

    from bertaccel.config import register_configs

    register_configs()
    return compose_config(overrides)


def imdb_lengths(path: str, tokenizer_cfg, rows: int, cap: int) -> List[int]:
    """Token lengths of the first `rows` IMDb reviews under the default model's WordPiece vocab."""
    from bertaccel.model import load_tokenizer

    tok = load_tokenizer(tokenizer_cfg)
    with gzip.open(path, "rt", newline="") as f:
        texts = [r["text"] for _, r in zip(range(rows), csv.DictReader(f))]
    return [min(len(ids), cap) for ids in tok(texts, truncation=False)["input_ids"]]


def batches(workload: str, rows: int, lengths: List[int], n: int, seed: int = 0) -> List[Dict[str, torch.Tensor]]:
    """n pinned host batches: ids, mask (padded to a multiple of 8) and labels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if workload == "S=128":
            lens = torch.full((rows,), 128)
        else:
            pick = torch.randint(0, len(lengths), (rows,), generator=g)
            lens = torch.tensor(lengths)[pick]
        seq = int(-(-int(lens.max()) // 8) * 8)
        mask = (torch.arange(seq)[None, :] < lens[:, None]).long()
        ids = torch.randint(1000, 30000, (rows, seq), generator=g) * mask
        batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 2, (rows,), generator=g)}
        # Pinned, as the loop's loaders pin them (train.pin_memory): copies that do not wait.
        out.append({k: t.pin_memory() for k, t in batch.items()} if torch.cuda.is_available() else batch)
    return out


def build(attention: str):
    from bertaccel.attention.packing import pass_masks_through
    from bertaccel.model import build_model
    from bertaccel.train.forward import sdpa_backends

    key_mask = attention == "sdpa [B,1,1,S]"
    cfg = compose([f"attention={'sdpa' if key_mask else attention}", "model=bert_base_random"])
    torch.manual_seed(0)
    model, _ = build_model(cfg.model, 2, cfg.attention, 30522)
    model = model.to(DEV).train()
    if key_mask:
        pass_masks_through(model)
        return model, nullcontext
    return model, sdpa_backends(cfg)


def autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def eager_stepper(model, ctx) -> Callable[[Dict[str, torch.Tensor]], None]:
    from bertaccel.train.forward import model_inputs

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)

    def step(host):
        b = model_inputs(host, DEV)
        with autocast(), ctx():
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        F.cross_entropy(logits.float(), b["labels"]).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def graph_stepper(model, ctx, data: List[Dict[str, torch.Tensor]]) -> Callable[[Dict[str, torch.Tensor]], None]:
    from bertaccel.options.precision import Precision
    from bertaccel.train.forward import Forward
    from bertaccel.train.step_graph import StepGraphs

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=torch.tensor(1e-5, device=DEV), fused=True, capturable=True)
    graphs = StepGraphs(Forward(model, Precision("bf16", DEV), DEV, ctx), opt, 1.0)
    rows = data[0]["input_ids"].shape[0]
    graphs.capture(rows, sorted({b["input_ids"].shape[1] for b in data}))
    return lambda host: graphs.step([host], rows)


def time_steps(step, data, warmup: int, steps: int) -> float:
    for b in data[:warmup]:
        step(b)
    torch.cuda.synchronize()
    times = []
    for b in data[warmup:warmup + steps]:
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(b)
        e.record()
        times.append((a, e))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(e) for a, e in times)


def part1(args, lengths: List[int]) -> List[Dict]:
    rows = []
    for workload in ("S=128", "IMDb<=256"):
        for bsz in args.batch_sizes:
            data = batches(workload, bsz, lengths, args.warmup + args.steps)
            real = sum(int(b["attention_mask"].sum()) for b in data) / sum(b["attention_mask"].numel() for b in data)
            for mode in ("eager", "step_graph"):
                for attention in args.attentions:
                    row = {"workload": workload, "B": bsz, "mode": mode, "attention": attention,
                           "real_token_fraction": round(real, 3)}
                    model = step = None
                    gc.collect()
                    torch.cuda.empty_cache()  # the previous cell's graphs, optimizer and pool are gone
                    try:
                        model, ctx = build(attention)
                        t0 = time.perf_counter()
                        step = eager_stepper(model, ctx) if mode == "eager" else graph_stepper(model, ctx, data)
                        row["setup_s"] = round(time.perf_counter() - t0, 1)
                        row["ms_step"] = time_steps(step, data, args.warmup, args.steps)
                        row["samples_s"] = bsz / row["ms_step"] * 1000
                    except Exception as e:  # noqa: BLE001 - one failed cell is reported, the rest go on
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    return rows


def host_us(fn: Callable[[], None], calls: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def part2(profile: bool) -> List[Dict]:
    """Host microseconds per attention call, forward+backward, on tiny bf16 tensors (B=2, S=16,
    H=12, D=64), so the GPU is idle waiting: the per-call overhead of each path."""
    import xformers.ops as xops

    from bertaccel.attention.kernels import xformers as xformers_kernel
    from bertaccel.attention.packing import pack_exact, pack_static
    from bertaccel.attention.triton_attention import fused_attention, fused_attention_packed

    bsz, seq, heads, dim = 2, 16, 12, 64
    q, k, v = (torch.randn(bsz, seq, heads, dim, device=DEV, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    keep = torch.ones(bsz, seq, dtype=torch.bool, device=DEV)
    keep[1, 9:] = False
    additive = torch.zeros(bsz, 1, 1, seq, device=DEV, dtype=torch.bfloat16).masked_fill(~keep[:, None, None], -1e4)
    exact = pack_exact(keep)
    exact.bias = xformers_kernel._xformers_prepare(exact)
    t = exact.tokens
    qp, kp, vp = (x.detach().reshape(-1, heads, dim)[:t].clone().requires_grad_() for x in (q, k, v))

    def fb(f):
        def call():
            f().sum().backward()
        return call

    tr = lambda x: x.transpose(1, 2)  # noqa: E731
    cases = {
        "sdpa, padding mask [B,1,1,S] (EFFICIENT)": fb(lambda: F.scaled_dot_product_attention(
            tr(q), tr(k), tr(v), attn_mask=additive)),
        "sdpa, no mask": fb(lambda: F.scaled_dot_product_attention(tr(q), tr(k), tr(v))),
        "xformers dense, op chosen per call (dispatcher)": fb(lambda: xops.memory_efficient_attention(q, k, v)),
        "xformers dense, op named (ours)": fb(lambda: xformers_kernel._xformers_dense(q, k, v, 0.0, 0.125)),
        "xformers packed, BlockDiagonalMask built per call": fb(lambda: xops.memory_efficient_attention(
            qp[None], kp[None], vp[None], attn_bias=xformers_kernel._xformers_prepare(exact))),
        "xformers packed, mask built once per batch (ours)": fb(lambda: xformers_kernel._xformers_packed(
            qp, kp, vp, exact, 0.0, 0.125)),
        "xformers padded bias [B,H,S,S] per call (before)": fb(lambda: xops.memory_efficient_attention(
            q, k, v, attn_bias=torch.zeros(bsz, heads, seq, seq, device=DEV, dtype=q.dtype).masked_fill(
                ~keep[:, None, None, :], float("-inf")))),
        "triton padded, key mask (before)": fb(lambda: tr(fused_attention(tr(q), tr(k), tr(v), keep))),
        "triton packed (ours)": fb(lambda: fused_attention_packed(qp, kp, vp, exact.cu_seqlens, exact.max_seqlen)),
        "packing once per batch: pack_exact (host sync)": lambda: pack_exact(keep),
        "packing once per batch: pack_static": lambda: pack_static(keep),
    }
    rows = []
    for name, fn in cases.items():
        try:
            rows.append({"path": name, "host_us_per_call": round(host_us(fn), 1)})
            if profile and name in PROFILED:
                rows[-1]["profile"] = where_host_time_goes(fn)
        except Exception as e:  # noqa: BLE001
            rows.append({"path": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
        print(json.dumps(rows[-1]), flush=True)
    return rows


# The paths whose host time part 3 breaks down by function (cProfile).
PROFILED = ("sdpa, padding mask [B,1,1,S] (EFFICIENT)", "xformers packed, mask built once per batch (ours)",
            "triton packed (ours)")


def where_host_time_goes(fn: Callable[[], None], calls: int = 200, top: int = 12) -> List[Dict]:
    """The functions that take a call's host time (self time, us per call), from cProfile."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = [{"function": f"{Path(file).name}:{line} {name}", "self_us": tt / calls * 1e6, "cum_us": ct / calls * 1e6,
             "calls_per_call": nc / calls}
            for (file, line, name), (_, nc, tt, ct, _) in stats.stats.items()]
    return sorted(rows, key=lambda r: -r["self_us"])[:top]


def table1(rows: List[Dict]) -> str:
    out = ["| workload | B | mode | real tokens | sdpa ms/step | sdpa [B,1,1,S] ms/step | xformers ms/step "
           "| triton ms/step | best sdpa samples/s | xformers samples/s (x best sdpa) | triton samples/s (x best sdpa) |",
           "|" + "---|" * 11]
    keys = sorted({(r["workload"], r["B"], r["mode"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
    for key in keys:
        cell = {r["attention"]: r for r in rows if (r["workload"], r["B"], r["mode"]) == key}
        base = max((cell.get(a, {}).get("samples_s") or 0 for a in ("sdpa", "sdpa [B,1,1,S]")), default=0) or None

        def ms(a):
            r = cell.get(a, {})
            return f"{r['ms_step']:.2f}" if "ms_step" in r else r.get("error", "-")

        def sps(a, ratio=True):
            r = cell.get(a, {})
            if "samples_s" not in r:
                return "-"
            return f"{r['samples_s']:.0f}" + (f" ({r['samples_s'] / base:.2f}x)" if ratio and base else "")
        frac = next(iter(cell.values()))["real_token_fraction"]
        best = f"{base:.0f}" if base else "-"
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {frac:.2f} | {ms('sdpa')} | {ms('sdpa [B,1,1,S]')} | {ms('xformers')} "
                   f"| {ms('triton')} | {best} | {sps('xformers')} | {sps('triton')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imdb", default=".devdata/train.csv.gz", help="IMDb train CSV (text,label), gzip")
    ap.add_argument("--imdb-rows", type=int, default=4000)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None, help="write all rows as JSON here")
    ap.add_argument("--attentions", nargs="+", default=list(ATTENTIONS), choices=ATTENTIONS)
    ap.add_argument("--skip-steps", action="store_true", help="only part 2 (host cost per call)")
    ap.add_argument("--profile", action="store_true", help="part 3: where each backend's host time per call goes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark needs a CUDA GPU (tests/test_packing.py and tests/test_triton_packed.py "
                 "cover correctness on the CPU)")
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  {time.strftime('%Y-%m-%d')}", flush=True)
    rows1: List[Dict] = []
    if not args.skip_steps:
        lengths = imdb_lengths(args.imdb, compose([]).model, args.imdb_rows, 256)
        print(f"# IMDb: {len(lengths)} reviews, mean {statistics.mean(lengths):.0f} tokens (cap 256)", flush=True)
        rows1 = part1(args, lengths)
    rows2 = part2(args.profile)
    if rows1:
        print("\n" + table1(rows1))
    print("\n| attention call path (fwd+bwd, B=2 S=16 bf16) | host us/call |\n|---|---|")
    for r in rows2:
        print(f"| {r['path']} | {r.get('host_us_per_call', r.get('error'))} |")
    for r in rows2:
        if "profile" in r:
            print(f"\n{r['path']}: host time by function (self us per attention call, cProfile)")
            for f in r["profile"]:
                print(f"  {f['self_us']:8.1f} us self {f['cum_us']:8.1f} cum  x{f['calls_per_call']:.0f}  {f['function']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": rows1, "host": rows2}, indent=1))


if __name__ == "__main__":
    main()
