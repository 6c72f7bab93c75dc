"""A short torch.profiler window and its kernel breakdown (seed 003's categories).

The window runs after training and evaluation, on the trained model with the run's own step
function, so none of the timed or measured training windows contain profiler overhead, and
everything it sees is warm (compiled graphs included). It trains a few more steps: their
weights are never evaluated or saved.

GPU runs are broken down by CUDA kernel self time; CPU runs by aten operator self time (CPU
"kernels"). Categories follow seed 003: GEMM (including eager attention's two batched GEMMs,
as seed 003 counts them), attention (fused attention kernels and scale/mask/softmax),
elementwise/normalization, optimizer (the update phase: optimizer, grad scaling and
clipping) and other.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

import torch

CATEGORIES = ("gemm", "attention", "elementwise", "optimizer", "other")

# First match wins; case-insensitive. Kernel names are long C++ signatures, so the rules look
# for the tell-tale part (cuBLAS/CUTLASS families, functor names, aten operator names).
_RULES = [
    ("optimizer", r"adam|adan|lamb(?!da)|sgd|multi_tensor|foreach|optimizer|clip_grad|unscale|non_finite"),
    # ^_fwd_kernel$ / ^_bwd_kernel$: our Triton attention (bertaccel/attention/triton_kernels.py)
    ("attention", r"flash|fmha|attention|attn|sdpa|(?<!log)(?<!log_)softmax|cutlassf|cutlassb|"
                  r"^_fwd_kernel$|^_bwd_kernel$"),
    ("gemm", r"gemm|gemv|addmm|bmm|\bmm\b|mmbackward|matmul|linear|cublas|cutlass|xmma|nvjet|"
             r"sm\d\d_|s16816|s1688|splitk"),
    ("elementwise", r"elementwise|vectorized|norm|gelu|dropout|bernoulli|add|mul|div|sub|copy|fill|"
                    r"reduce|triton_|cat|where|masked|tanh|exp|sqrt|pow|sum|mean|clone|zero|cast|"
                    r"unrolled|relu|erf|threshold|neg|rsub|to_copy|contiguous|softmax|nll_loss|gammabeta|"
                    r"bdrln"),  # encoder=fused's bias+dropout+residual+LayerNorm (bertaccel/encoder/kernels.py)
]
_COMPILED = [(c, re.compile(p, re.IGNORECASE)) for c, p in _RULES]
# Profiler bookkeeping, not work: its self time is Python between operators.
_SKIP = re.compile(r"^ProfilerStep")


def categorize(name: str) -> str:
    for category, rule in _COMPILED:
        if rule.search(name):
            return category
    return "other"


@dataclass
class KernelRow:
    name: str
    self_time_us: float
    share: float
    category: str
    calls: int


@dataclass
class KernelProfile:
    timeline: str                  # "cuda kernels" or "cpu operators"
    steps: int
    total_self_time_us: float
    shares: Dict[str, float]       # category -> share of total self time
    top: List[KernelRow] = field(default_factory=list)
    trace_path: Optional[str] = None

    def to_json(self) -> dict:
        return asdict(self)


def _in_optimizer(evt) -> bool:
    """Inside an `Optimizer.step#...` / `Optimizer.zero_grad#...` record_function (torch adds them)?"""
    while evt is not None:
        if evt.name.startswith("Optimizer."):
            return True
        evt = evt.cpu_parent
    return False


def summarize(prof: torch.profiler.profile, on_gpu: bool, steps: int, top_k: int = 10) -> KernelProfile:
    """Self time per kernel (GPU) or operator (CPU), rolled up into CATEGORIES.

    Work run under torch's `Optimizer.step#...` record_function is "optimizer" whatever its
    name (the CPU AdamW is a stream of plain sqrt/mul/lerp ops); the rest goes by name. GPU
    kernels are attributed through the CPU operator that launched them.
    """
    per_name: Dict[tuple, list] = {}  # (name, category) -> [self_us, calls]

    def add(name: str, us: float, category: str) -> None:
        row = per_name.setdefault((name, category), [0.0, 0])
        row[0] += us
        row[1] += 1

    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CPU or _SKIP.match(evt.name):
            continue
        optimizer = _in_optimizer(evt)
        if on_gpu:
            for k in evt.kernels:
                add(k.name, float(k.duration), "optimizer" if optimizer else categorize(k.name))
        elif evt.self_cpu_time_total > 0:
            add(evt.name, float(evt.self_cpu_time_total), "optimizer" if optimizer else categorize(evt.name))
    total = sum(us for us, _ in per_name.values())
    if total <= 0:
        raise RuntimeError(f"the profiler recorded no {'CUDA kernel' if on_gpu else 'CPU operator'} time")
    shares = {c: 0.0 for c in CATEGORIES}
    for (_, category), (us, _) in per_name.items():
        shares[category] += us / total
    ranked = sorted(per_name.items(), key=lambda kv: kv[1][0], reverse=True)[:top_k]
    top = [KernelRow(name, us, us / total, category, calls) for (name, category), (us, calls) in ranked]
    return KernelProfile("cuda kernels" if on_gpu else "cpu operators", steps, total, shares, top)


def profile_steps(step: Callable[[object], None], windows: Iterable, device: torch.device,
                  warmup: int, active: int, out_dir: Path, top_k: int = 10) -> KernelProfile:
    """Run `warmup` unrecorded then `active` recorded optimizer steps; save a gzipped Chrome trace."""
    from torch.profiler import ProfilerActivity, profile, schedule

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    it = iter(windows)
    done = 0
    with profile(activities=activities, schedule=schedule(wait=0, warmup=warmup, active=active, repeat=1),
                 record_shapes=False) as prof:
        for _ in range(warmup + active):
            try:
                window = next(it)
            except StopIteration:
                break
            step(window)
            if on_gpu:
                torch.cuda.synchronize(device)
            prof.step()
            done += 1
    recorded = max(done - warmup, 0)
    if recorded == 0:
        raise RuntimeError(f"the training data has only {done} step(s); the profile needs "
                           f"{warmup + active} (profile_window.warmup_steps + active_steps)")
    result = summarize(prof, on_gpu, recorded, top_k)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "trace.json"
    prof.export_chrome_trace(str(raw))
    gz = out_dir / "trace.json.gz"
    with open(raw, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    result.trace_path = str(gz)
    return result


def write_report(kp: KernelProfile, out_dir: Path) -> List[Path]:
    """kernels.md (human) and kernels.json (machine) beside the trace."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# Kernel profile: {kp.timeline}, {kp.steps} optimizer steps after training",
          "", f"Total self time: {kp.total_self_time_us / 1000:.2f} ms "
              f"({kp.total_self_time_us / 1000 / kp.steps:.2f} ms per step)", "",
          "| category | share |", "|---|---|"]
    md += [f"| {c} | {kp.shares[c]:.1%} |" for c in CATEGORIES]
    md += ["", f"## Top {len(kp.top)} by self time", "",
           "| # | share | self ms | calls | category | name |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(kp.top, 1):
        name = r.name if len(r.name) <= 140 else r.name[:137] + "..."
        md.append(f"| {i} | {r.share:.1%} | {r.self_time_us / 1000:.2f} | {r.calls} | {r.category} | "
                  f"`{name.replace('|', '/')}` |")
    paths = [out_dir / "kernels.md", out_dir / "kernels.json"]
    paths[0].write_text("\n".join(md) + "\n")
    paths[1].write_text(json.dumps(kp.to_json(), indent=1))
    return paths
