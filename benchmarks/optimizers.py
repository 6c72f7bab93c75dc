"""One optimizer step over BERT-base's parameters, every optimizer option side by side.

    python benchmarks/optimizers.py [--device cuda] [--steps 50] [--options adamw_single,adamw,...]
    python benchmarks/optimizers.py --device cpu --tiny      # a check of the script, not a benchmark
    python benchmarks/optimizers.py --capturable             # also each option built as compile.step_graph builds it

The parameters are BERT-base's (random init, fp32 master weights and optimizer state, bf16 model
compute is irrelevant to the step), with gradients filled once. Each option is built from its
own YAML (conf/optimizer/<option>.yaml, through bertaccel.options.optimizer.build_optimizer: the same path a
run takes), warmed up, then timed over --steps steps. Columns:
- ms/step: median of per-step times (CUDA events on a GPU, the host clock on a CPU);
- launches/step: GPU kernels per step counted by torch.profiler (CUDA runtime launches); on a
  CPU the count of aten operators instead (the kernel count's analogue there);
- vs adamw_fused: ms/step relative to adamw_fused (AdamWFused, the same one-launch flat-buffer
  machinery as adan_fused, so the ratio is the algorithms' cost; seed 004's goal: adan_fused
  within 1.2x of a fused AdamW, and >= 3x faster than the unfused single-tensor Adan, adan_single).
An option this machine cannot run (adan_fused, adamw_fused without a GPU or TRITON_INTERPRET) is a
row with its reason. --capturable adds a row per option built capturable (state and lr on the
device, what compile.step_graph=true replays; the flat-buffer optimizers then also advance their
step count in a second launch), for the options that can be.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bertaccel.config import CONF_DIR  # noqa: E402
OPTIONS = ("adamw_single", "adamw", "adamw_fused", "adan_single", "adan", "adan_fused", "lamb")


def _model(tiny: bool, device: torch.device) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = (BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
           if tiny else BertConfig())  # BertConfig() is BERT-base: 12 x 768, 110M parameters
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    return model


def _compose(option: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from bertaccel.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=[f"optimizer={option}"]).optimizer
    finally:
        GlobalHydra.instance().clear()


def _time_steps(opt: torch.optim.Optimizer, steps: int, device: torch.device) -> float:
    times: List[float] = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            opt.step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            opt.step()
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def _launches(opt: torch.optim.Optimizer, device: torch.device) -> int:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                   "cuLaunchKernelEx"))
    # aten operators called by the step itself (not those nested inside other aten operators)
    def outermost(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return False
            parent = parent.cpu_parent
        return True

    return sum(1 for e in events if e.name.startswith("aten::") and outermost(e))


def measure(option: str, tiny: bool, device: torch.device, steps: int, warmup: int,
            capturable: bool = False) -> Dict[str, Optional[float]]:
    from bertaccel.optimizers.flat import kernel_launches_per_step
    from bertaccel.options.optimizer import build_optimizer, optimizer_unusable

    cfg = _compose(option)
    why = optimizer_unusable(cfg, device)
    if why:
        return {"reason": why}
    model = _model(tiny, device)
    try:  # an option without a capturable mode, or not on this device, refuses at build or first step
        opt = build_optimizer(model, cfg, capturable=capturable)
        for _ in range(warmup):
            opt.step()
    except (TypeError, ValueError, RuntimeError, AssertionError) as e:
        if not capturable:
            raise
        return {"reason": f"not capturable here: {str(e).splitlines()[0][:160]}"}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = _time_steps(opt, steps, device)
    return {"ms": ms, "launches": _launches(opt, device),
            "params": sum(p.numel() for p in model.parameters()),
            "tensors": sum(1 for _ in model.parameters()),
            "triton": kernel_launches_per_step(opt) is not None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--options", default=",".join(OPTIONS))
    ap.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide BERT (CPU checks of the script)")
    ap.add_argument("--capturable", action="store_true",
                    help="also a row per option built capturable (as compile.step_graph=true builds it)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible; use --device cpu --tiny for a check", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    options = args.options.split(",")
    unknown = [o for o in options if not (CONF_DIR / "optimizer" / f"{o}.yaml").exists()]
    if unknown:
        print(f"error: unknown optimizer option(s) {', '.join(unknown)}; see conf/optimizer/", file=sys.stderr)
        return 2
    rows = {o: measure(o, args.tiny, device, args.steps, args.warmup) for o in options}
    if args.capturable:
        rows.update({f"{o} (capturable)": measure(o, args.tiny, device, args.steps, args.warmup, capturable=True)
                     for o in options})
    ref = rows.get("adamw_fused", {}).get("ms")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    sample = next((r for r in rows.values() if "params" in r), None)
    what = f"{sample['params'] / 1e6:.1f}M parameters in {sample['tensors']} tensors" if sample else "no option ran"
    print(f"one optimizer step, {'tiny BERT' if args.tiny else 'BERT-base'} ({what}), fp32 state; {name}, "
          f"torch {torch.__version__}; median of {args.steps} steps after {args.warmup}")
    unit = "kernel launches/step" if device.type == "cuda" else "aten ops/step"
    print(f"\n| option | ms/step | {unit} | vs adamw_fused |\n|---|---|---|---|")
    for option, r in rows.items():
        if "reason" in r:
            print(f"| {option} | null: {r['reason']} | - | - |")
            continue
        rel = f"{r['ms'] / ref:.2f}x" if ref else "-"
        print(f"| {option} | {r['ms']:.3f} | {r['launches']} | {rel} |")
    interpreted = [o for o, r in rows.items() if r.get("triton")]
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and interpreted:
        print(f"\n{', '.join(interpreted)} ran in Triton's interpreter (TRITON_INTERPRET=1): a correctness path, "
              "its time is not a speed")
    adan_f, adan_s = rows.get("adan_fused", {}).get("ms"), rows.get("adan_single", {}).get("ms")
    if adan_f and ref:
        print(f"\nadan_fused / adamw_fused = {adan_f / ref:.2f}x (goal <= 1.2x)")
    if adan_f and adan_s:
        print(f"adan_single / adan_fused = {adan_s / adan_f:.2f}x (goal >= 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
