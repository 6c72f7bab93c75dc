"""bertaccel's own step graph as a step_kernels.py row, beside the plain reduce-overhead loop (d).

Issue 62, item 5: `encoder=hf compile=default compile.step_graph=true` measured 1.28x d at B=32,
and the run's own profile window does not see the kernels a step graph replays. step_kernels.py
profiles any step it is given, so these rows build the run's pieces (Forward, StepGraphs, the
run's optimizers) over the same random-init model and batches as d, and its table, --top and
--diff then place the difference kernel by kernel:

- ba-micro: the micro graph and the update graph, gradients accumulated into buffers of our own
  and zeroed each step, our AdamWFused (what compile.step_graph=true ran before whole_step);
- ba-micro-dyn: the same, compiled with the length marked dynamic first (compile.dynamic_length,
  on by default, as the run's warm-up does before capture);
- ba-whole: one graph per length, forward + backward + update, fresh gradients (StepGraphs'
  whole_step, the run's path without accumulation), AdamWFused;
- ba-whole-torch: the same with torch's fused AdamW (capturable), d's optimizer;
- ba-whole-host: ba-whole fed as a run feeds it, pinned host batches copied in per step (the
  others read batches already on the device, as d does).

All compile the model with torch.compile's default mode, as compile=default does; bf16 autocast,
no clipping (d's settings).
"""
from __future__ import annotations

from typing import Callable, Dict, List

import torch

VARIANTS = ("ba-micro", "ba-micro-dyn", "ba-whole", "ba-whole-torch", "ba-whole-host")


def bertaccel_step(variant: str, model: torch.nn.Module, batches: List[Dict[str, torch.Tensor]],
                   device: torch.device) -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
    """step(batch) for one of VARIANTS, the graphs captured for the batches' one shape."""
    from bertaccel.optimizers.adamw_flat import AdamWFused
    from bertaccel.options.precision import Precision
    from bertaccel.train.forward import Forward, mark_length_dynamic
    from bertaccel.train.step_graph import StepGraphs

    if variant not in VARIANTS:
        raise ValueError(f"bertaccel_step: {variant!r} is not one of {', '.join(VARIANTS)}")
    # Forward as Forward.for_run builds it for a compiled run: every mask kept.
    forward = Forward(torch.compile(model), Precision("bf16", device), device, drop_full_mask=False,
                      module=model)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = torch.tensor(5e-5, device=device)  # capturable: the schedule writes lr on the device
    opt: torch.optim.Optimizer = (torch.optim.AdamW(params, lr=lr, fused=True, capturable=True)
                                  if variant.endswith("-torch") else AdamWFused(params, lr=lr, capturable=True))
    rows, length = batches[0]["input_ids"].shape
    if variant.endswith("-dyn"):  # the warm-up's compile: the length dimension marked dynamic
        first = dict(batches[0])
        mark_length_dynamic(first)
        forward.loss(first, rows).backward()
        for p in params:
            p.grad = None
    graphs = StepGraphs(forward, opt, None, whole_step=variant.startswith("ba-whole"))
    graphs.capture(rows, [length])
    if variant.endswith("-host"):  # each device batch's pinned host copy, made once
        host = {id(b): {k: v.cpu().pin_memory() for k, v in b.items()} for b in batches}
        return lambda batch: graphs.step([host[id(batch)]], rows)
    return lambda batch: graphs.step([batch], rows)
