"""Where a training step's GPU time goes: the plain-HF step of vs_hf.py, timed, then profiled.

    python benchmarks/step_kernels.py [--batch-sizes 32,256] [--seq 128] [--modes eager,compile,reduce-overhead]
                                      [--model bert_large_random]
    (modes also fused, fused-sdpa, their -fp8, and -graph of the eager ones: see MODES)

For each batch size and mode (BERT-base shape, random init, bf16 autocast, sdpa, fused AdamW, fixed
B x S batches of real text on the device, no clipping: vs_hf.py's rungs b/c/d) it prints one row:
- ms/step: median of CUDA-event intervals between steps (what a loop gets);
- GPU ms/step: the union of all GPU activity intervals (kernels, copies) the profiler saw, per step.
  ms/step minus this is time the GPU waited for the host. Kernels replayed from CUDA graphs are
  reported by CUPTI like any other, so the reduce-overhead row is covered too (its "kernels" column
  says how many it saw);
- the same GPU time split into seed 003's categories (bertaccel/measure/profiling.py's rules);
- the floor: model FLOPs / the profile's bf16 peak, and MFU at the measured step.
That answers issue 10's question of what a faster step would have to remove: host gaps (ms/step -
GPU ms) can go with CUDA graphs, the rest only with less or faster GPU work.
On a CPU (tests) the same rows come from operator self times; the numbers only prove the plumbing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

from bertaccel.measure.flops import TokenCounts, bert_train_flops, peak_tflops  # noqa: E402
from bertaccel.train.isolation import isolated_run  # noqa: E402
from bertaccel.measure.profiling import CATEGORIES, categorize, summarize  # noqa: E402
from bertaccel_step import VARIANTS, bertaccel_step  # noqa: E402
from vs_hf_common import (SEED, StepClock, bert_config, fixed_batches, free_memory, hardware_profile,  # noqa: E402
                          load_tokenizer_from, package_dir, random_bert, read_rows, shuffled_subset, sync)

# fused*: eager, our fused encoder (encoder=fused, bertaccel/encoder/) with our Triton attention core,
# or torch's varlen sdpa kernels (-sdpa); -fp8: its GEMMs' forward in FP8 (encoder/fp8_ops.py).
# compile-fp8: compile with precision=fp8's torchao float8 Linear layers (tensorwise).
# -graph: the whole step (forward, backward, fused AdamW) captured in one CUDA graph and replayed, a
# plain CUDA-graph loop (what compile.step_graph=true does in a run): no host work per step.
MODES = {"eager": None, "compile": "default", "reduce-overhead": "reduce-overhead", "compile-fp8": "default",
         "fused": None, "fused-sdpa": None, "fused-fp8": None, "fused-sdpa-fp8": None}
MODES.update({f"{m}-graph": None for m in ("eager", "fused", "fused-sdpa", "fused-fp8", "fused-sdpa-fp8")})
# ba-*: bertaccel's own step graph (Forward, StepGraphs, its optimizers) over the same model and
# batches, compiled in torch.compile's default mode: bertaccel_step.py says what each one is.
MODES.update({m: "default" for m in VARIANTS})


def gpu_activity(prof) -> List[tuple]:
    """(start_ns, end_ns, name) of every GPU activity the profiler recorded. Ranges that torch's
    record_function marks on the GPU timeline (e.g. "Optimizer.step#AdamW.step") are labels
    spanning kernels, not work: counted, they would double the optimizer's time."""
    return [(e.start_ns(), e.end_ns(), e.name()) for e in prof.profiler.kineto_results.events()
            if e.device_type() == torch.autograd.DeviceType.CUDA and not e.is_user_annotation()
            and not e.name().startswith(("Optimizer.", "ProfilerStep"))]


def union_ns(spans: List[tuple]) -> int:
    """Time covered by at least one span (overlapping streams counted once)."""
    total, end = 0, None
    for s, e, _ in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def graphed_step(model, opt, batch):
    """step(batch) replaying one CUDA graph of the whole step, captured on a copy of batch after
    three eager steps on a side stream (the kernels compiled, the optimizer's state made);
    autocast without its cache, which capture forbids. The fused encoder packs statically under
    capture (attention/packing.py): every padded token runs through the layers."""
    static = {k: v.clone() for k, v in batch.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)

    def body():
        with autocast:
            loss = model(**static).loss
        loss.backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)  # the captured backward then writes the gradients afresh each replay
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    def step(b):
        for k, v in b.items():
            static[k].copy_(v, non_blocking=True)
        graph.replay()
    return step


def measure(mode: str, batches, config, device, warmup: int, steps: int, profile_steps: int,
            top: int) -> Dict[str, object]:
    captured = mode.endswith("-graph")
    mode = mode[:-len("-graph")] if captured else mode
    model = random_bert(config, "sdpa")
    if mode.startswith("fused"):
        from types import SimpleNamespace

        from bertaccel.encoder.swap import fuse_encoder

        sdpa = "-sdpa" in mode
        fuse_encoder(model, SimpleNamespace(packed=True, fused_kernels=True),
                     SimpleNamespace(swap=None if sdpa else "triton", hf_implementation="sdpa" if sdpa else "eager"))
        for layer in model.base_model.encoder.layer:
            layer.fp8 = mode.endswith("-fp8")
    model = model.to(device).train()
    if mode == "compile-fp8":
        from bertaccel.options.precision import Precision

        Precision("fp8", device).prepare(model)  # (before compile, as the run does)
    if mode in VARIANTS:
        return profile_row(bertaccel_step(mode, model, batches, device), model, batches, device, warmup, steps,
                           profile_steps, top)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True, capturable=captured)
    forward = model if MODES[mode] is None else torch.compile(model, mode=MODES[mode])
    graphs = mode == "reduce-overhead"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    def step(batch):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = forward(**batch).loss
        loss.backward()
        opt.step()

    if captured:
        step = graphed_step(model, opt, batches[0])
    return profile_row(step, model, batches, device, warmup, steps, profile_steps, top)


def profile_row(step, model, batches, device, warmup: int, steps: int, profile_steps: int,
                top: int) -> Dict[str, object]:
    """One table row for a built step: warm-up steps, the median CUDA-event step time over
    `steps`, then a profile of `profile_steps` (GPU activity per kernel name, per category)."""
    for i in range(warmup):
        step(batches[i % len(batches)])
    sync(device)
    clock = StepClock(device, steps)
    clock.mark(0)
    for i in range(steps):
        step(batches[i % len(batches)])
        clock.mark(i + 1)
    sync(device)
    step_ms = statistics.median(clock.step_ms())

    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=acts) as prof:
        for i in range(profile_steps):
            step(batches[i % len(batches)])
        sync(device)
    row: Dict[str, object] = {"ms/step": step_ms}
    if on_gpu:
        spans = gpu_activity(prof)
        row["GPU ms/step"] = union_ns(spans) / 1e6 / profile_steps
        row["kernels"] = len(spans) / profile_steps
        per_cat = {c: 0.0 for c in CATEGORIES}
        per_name: Dict[str, float] = {}
        calls: Dict[str, float] = {}
        for s, e, name in spans:
            per_cat[categorize(name)] += (e - s) / 1e6 / profile_steps
            per_name[name] = per_name.get(name, 0.0) + (e - s) / 1e6 / profile_steps
            calls[name] = calls.get(name, 0.0) + 1 / profile_steps
        row["top"] = sorted(per_name.items(), key=lambda kv: -kv[1])[:top]
        row["per_name"], row["calls"] = per_name, calls
    else:  # CPU: operator self time, split the same way
        kp = summarize(prof, on_gpu=False, steps=profile_steps)
        row["GPU ms/step"] = None
        row["kernels"] = None
        per_cat = {c: kp.shares[c] * kp.total_self_time_us / 1000 / profile_steps for c in CATEGORIES}
        row["top"] = [(k.name, k.self_time_us / 1000 / profile_steps) for k in kp.top[:top]]
    row.update({f"{c} ms": v for c, v in per_cat.items()})
    b, s = batches[0]["input_ids"].shape
    counts = TokenCounts(sequences=b, padded_tokens=b * s, attention_pairs=b * s * s,
                         real_tokens=int(batches[0]["attention_mask"].sum()))
    row["flops"] = bert_train_flops(model, counts)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--batch-sizes", default="32,256")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--modes", default="eager,compile,reduce-overhead", help=f"subset of {','.join(MODES)}")
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--data", help="CSV for the batches' text (default: the bundled AG News sample)")
    ap.add_argument("--top", type=int, default=0, help="also list each row's N most expensive kernels")
    ap.add_argument("--diff", metavar="BASE", help="a mode of --modes: for every other row, the 25 kernels "
                    "whose ms/step differ most from BASE's, side by side (GPU)")
    ap.add_argument("--tiny", action="store_true", help="hidden 32 / 2 layers (CPU tests)")
    ap.add_argument("--model", help="a model option whose shape to train instead of BERT-base's, e.g. "
                                    "bert_large_random (conf/model/; random init)")
    ap.add_argument("--no-dropout", action="store_true",
                    help="dropout 0 in hidden states and attention: what BERT's dropout costs per step")
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"error: --modes {','.join(bad)}: not one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible; use --device cpu", file=sys.stderr)
        return 2
    if a.diff and (a.diff not in modes or a.device != "cuda"):
        print(f"error: --diff {a.diff}: give a mode that is also in --modes, on --device cuda (the diff "
              "compares GPU kernel times)", file=sys.stderr)
        return 2
    graphed = [m for m in modes if m == "reduce-overhead" or m.endswith("-graph") or m in VARIANTS]
    if a.device == "cpu" and graphed:
        print(f"error: --modes {','.join(graphed)} replays CUDA graphs and needs --device cuda", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    profile, note = hardware_profile(device)
    tok = load_tokenizer_from(package_dir())
    data = a.data or str(REPO / "bertaccel" / "samples" / "ag_news" / "train.csv.gz")
    texts, labels = read_rows(data, ["text"] if a.data else ["title", "description"], "label")
    texts, labels = shuffled_subset(texts, labels, None)
    label_ids = {v: i for i, v in enumerate(sorted(set(labels)))}
    config = bert_config(a.tiny, tok.vocab_size, len(label_ids))
    if a.model:
        from fp8_ffn import model_config

        config = model_config(a.model)
        config.vocab_size, config.num_labels = tok.vocab_size, len(label_ids)
    if a.no_dropout:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    peak = peak_tflops(profile, "bf16")[0] if profile else None
    cols = ["B", "mode", "ms/step", "GPU ms/step", "host gap ms", "kernels"] + [f"{c} ms" for c in CATEGORIES] + \
        ["floor ms", "MFU"]
    print(f"device: {note}; torch {torch.__version__}; model {a.model or ('tiny' if a.tiny else 'BERT-base')} "
          f"({config.hidden_size} wide, {config.num_hidden_layers} layers); S={a.seq}; bf16 autocast, sdpa, fused AdamW, "
          f"no clipping; dropout {config.hidden_dropout_prob}")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols), flush=True)
    rows, tops, failed = table_rows(a, modes, tok, texts, labels, config, device, peak)
    for label, top in tops:
        print(f"\n{label}: most expensive kernels, ms/step")
        for name, ms in top:
            print(f"  {ms:7.3f}  {name[:150]}")
    if a.diff:
        for (b, mode), r in rows.items():
            if mode != a.diff and (b, a.diff) in rows:
                print_diff(f"B={b}", a.diff, rows[(b, a.diff)], mode, r)
    if peak is None:
        print(f"floor/MFU: '-' (no bf16 peak: {peak_tflops(profile, 'bf16')[1] if profile else note})")
    return 1 if failed else 0


def table_rows(a: argparse.Namespace, modes: List[str], tok, texts: List[str], labels: List[str], config, device,
               peak) -> tuple:
    """Measure and print one row per batch size and mode; (rows by (B, mode), --top lists, failures)."""
    label_ids = {v: i for i, v in enumerate(sorted(set(labels)))}
    tops: List[tuple] = []
    rows: Dict[tuple, Dict[str, object]] = {}
    failed = 0
    for b in map(int, a.batch_sizes.split(",")):
        batches = fixed_batches(tok, texts, [label_ids[v] for v in labels], b, a.seq, 4, device)
        for mode in modes:
            try:
                with isolated_run(SEED, shared_process=True):
                    r = measure(mode, batches, config, device, a.warmup_steps, a.steps, a.profile_steps, a.top)
            except Exception as e:  # one mode that cannot run is reported; the others still run
                failed += 1
                print(f"| {b} | {mode} | failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''} |",
                      flush=True)
                continue
            finally:
                free_memory()
            rows[(b, mode)] = r
            floor = r["flops"] / (peak * 1e12) * 1000 if peak else None
            gpu = r["GPU ms/step"]
            cells = [b, mode, r["ms/step"], gpu, None if gpu is None else r["ms/step"] - gpu, r["kernels"]] + \
                [r[f"{c} ms"] for c in CATEGORIES] + [floor, None if floor is None else floor / r["ms/step"]]
            print("| " + " | ".join("-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
                                    for v in cells) + " |", flush=True)
            if a.top:
                tops.append((f"B={b} {mode}", r["top"]))
    return rows, tops, failed


def print_diff(label: str, base: str, base_row: Dict[str, object], mode: str, row: Dict[str, object],
               top: int = 25) -> None:
    """The kernels whose GPU ms/step differ most between two rows (by name; a name one row lacks
    counts 0 there), with calls per step, and what the rest adds up to."""
    ms_a, ms_b = base_row["per_name"], row["per_name"]
    calls_a, calls_b = base_row["calls"], row["calls"]
    assert isinstance(ms_a, dict) and isinstance(ms_b, dict) and isinstance(calls_a, dict) and isinstance(calls_b, dict)
    names = sorted(set(ms_a) | set(ms_b), key=lambda n: -abs(ms_b.get(n, 0.0) - ms_a.get(n, 0.0)))
    print(f"\n{label}: {mode} against {base}, GPU ms/step by kernel (largest differences first)")
    print(f"| kernel | {base} ms | calls | {mode} ms | calls | difference ms |\n|---|---|---|---|---|---|")
    for n in names[:top]:
        print(f"| {n[:110]} | {ms_a.get(n, 0.0):.4f} | {calls_a.get(n, 0):.0f} | {ms_b.get(n, 0.0):.4f} | "
              f"{calls_b.get(n, 0):.0f} | {ms_b.get(n, 0.0) - ms_a.get(n, 0.0):+.4f} |")
    rest = sum(ms_b.get(n, 0.0) - ms_a.get(n, 0.0) for n in names[top:])
    total = sum(ms_b.values()) - sum(ms_a.values())
    print(f"| the other {max(len(names) - top, 0)} kernels | | | | | {rest:+.4f} |\n"
          f"| all kernels (summed, not their union) | {sum(ms_a.values()):.4f} | {sum(calls_a.values()):.0f} | "
          f"{sum(ms_b.values()):.4f} | {sum(calls_b.values()):.0f} | {total:+.4f} |")


if __name__ == "__main__":
    sys.exit(main())
