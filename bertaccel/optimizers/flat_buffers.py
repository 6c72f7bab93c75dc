"""The flat buffers of a flat-buffer optimizer (flat.py): their layout, and the parameters and
saved state moved into them.

One bucket per (param group, device, dtype) holds flat 1-D buffers: the parameters, their
gradients and one per state tensor of the algorithm. Building it copies the parameters in and
re-points ``p.data`` to views of the flat parameter buffer; the optimizer's ``state[p]`` holds
views of the flat state buffers. The parameter stays the same nn.Parameter object (the module,
autograd, hooks and state_dict see nothing different), only its storage moved. Each tensor starts
at a multiple of BLOCK elements (the padding is at most BLOCK - 1 elements per tensor, kept at
zero), so a kernel program never straddles two tensors: one program = BLOCK elements of one
parameter.

A bucket of fp16 or bf16 parameters keeps an fp32 flat MASTER copy of them and fp32 state; the
parameters are views of a flat half "workspace" buffer. A saved master is used only if the
parameter still equals it rounded to the parameter's dtype (the model was loaded from the same
checkpoint); otherwise the master restarts from the parameter. Each parameter's entry gets the
bucket's "step" tensor.
"""
from __future__ import annotations

from typing import Any, Dict, List, MutableMapping, Optional, Tuple

import torch

BLOCK = 1024       # elements per kernel program; every tensor's segment starts at a multiple of it
MASTER_DTYPES = (torch.float16, torch.bfloat16)  # parameters of these dtypes get an fp32 master
MASTER_KEY = "master_param"                       # the fp32 master's key in state and state_dict


class Stale(Exception):
    """A bucket no longer matches its parameters (storage replaced, params changed): rebuild."""


class Bucket:
    """The flat buffers of one (param group, device, dtype): the parameters' storage (the half
    workspace in master mode), gradients, the fp32 master (half parameters only), the state."""

    def __init__(self, params: List[torch.nn.Parameter], device: torch.device, dtype: torch.dtype,
                 state_keys: Tuple[str, ...]):
        self.params = params
        self.device, self.dtype = device, dtype
        self.offsets: List[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += -(-p.numel() // BLOCK) * BLOCK  # segments start at multiples of BLOCK
        self.total = max(total, BLOCK)
        self.blocks_of: List[range] = [range(o // BLOCK, (o + p.numel() + BLOCK - 1) // BLOCK)
                                       for o, p in zip(self.offsets, params)]
        master = dtype in MASTER_DTYPES
        state_dtype = torch.float32 if master else dtype
        z = lambda dt: torch.zeros(self.total, device=device, dtype=dt)  # noqa: E731
        self.p, self.g = z(dtype), z(dtype)
        self.master: Optional[torch.Tensor] = z(torch.float32) if master else None
        self.state: Dict[str, torch.Tensor] = {key: z(state_dtype) for key in state_keys}
        self.pviews = [self.view(self.p, i) for i in range(len(params))]
        self.gviews = [self.view(self.g, i) for i in range(len(params))]
        self.ptrs = [t.data_ptr() for t in self.pviews]
        self.started = [False] * len(params)  # the tensor has stepped (its state exists)
        self.host_k = 0                       # steps this bucket took as far as the host knows
        self.step: torch.Tensor = torch.zeros(())
        self.betas: Tuple[float, ...] = ()
        self.betas64: Optional[torch.Tensor] = None  # capturable: the betas in fp64, on the device
        self.table_key: Optional[Tuple[bool, ...]] = None
        self.table: Optional[torch.Tensor] = None

    def flat(self, i: int) -> slice:
        return slice(self.offsets[i], self.offsets[i] + self.params[i].numel())

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        return flat[self.flat(i)].view(self.params[i].shape)

    def block_table(self, active: List[bool]) -> torch.Tensor:
        key = tuple(active)
        table = self.table
        if key != self.table_key or table is None:  # (table is None only before the first key)
            # (some tensor is active: flat.py launches no update otherwise)
            idx = [b for a, r in zip(active, self.blocks_of) if a for b in r]
            table = self.table = torch.tensor(idx, dtype=torch.int32, device=self.device)
            self.table_key = key
        return table


@torch.no_grad()
def build_bucket(params: List[torch.nn.Parameter], device: torch.device, dtype: torch.dtype,
                 state_keys: Tuple[str, ...], state: MutableMapping[Any, Dict[str, Any]], group: Dict[str, Any],
                 name: str) -> Bucket:
    """The bucket of `params` (one group, device and dtype), filled from the parameters, their
    gradients and their saved `state` (the optimizer's, keyed by parameter); each parameter's
    storage, gradient and state entry then become views of the bucket's buffers."""
    b = Bucket(params, device, dtype, state_keys)
    steps = []
    for i, p in enumerate(params):
        flat = b.flat(i)
        b.p[flat].copy_(p.detach().reshape(-1))
        st = state.get(p, {})
        if b.master is not None:
            saved: Optional[torch.Tensor] = st.get(MASTER_KEY)
            # A saved master counts only while the parameter still holds it (rounded): weights
            # written into the parameter since (another checkpoint) win, the master restarts there.
            # (A host sync per tensor, at a rebuild only.)
            source: torch.Tensor = p
            if saved is not None and torch.equal(saved.detach().to(device, dtype).reshape(p.shape), p.detach()):
                source = saved
            b.master[flat].copy_(source.detach().reshape(-1))
        for key, buf in b.state.items():
            if key in st:
                buf[flat].copy_(st[key].detach().reshape(-1))
        b.started[i] = all(key in st for key in state_keys)
        if "step" in st:
            steps.append(float(st["step"]))  # (a host sync once, at a rebuild)
        if p.grad is not None:
            if p.grad.is_sparse:
                raise RuntimeError(f"{name} does not support sparse gradients")
            b.g[flat].copy_(p.grad.reshape(-1))
    k = max(steps) if steps else 0.0
    b.host_k = int(k)
    if group["capturable"]:
        b.step = torch.full((), k, dtype=torch.float32, device=device)
        b.betas = tuple(group["betas"])
        b.betas64 = torch.tensor(b.betas, dtype=torch.float64, device=device)
    else:
        b.step = torch.full((), k, dtype=torch.float32)
    for i, p in enumerate(params):
        p.data = b.pviews[i]  # the same Parameter object, its storage now in the flat buffer
        if p.grad is not None:
            p.grad = b.gviews[i]
        st = {"step": b.step, **{key: b.view(buf, i) for key, buf in b.state.items()}}
        if b.master is not None:
            st[MASTER_KEY] = b.view(b.master, i)
        state[p] = st
    return b
