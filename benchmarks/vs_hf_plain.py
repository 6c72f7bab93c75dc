"""vs_hf.py's plain-HF rungs: BertForSequenceClassification trained by a hand-written loop
(zero_grad, forward under autocast, backward, AdamW step; no clipping) on fixed B x S batches of
real text already on the device, one table row per rung and batch size.

Rungs b' and d' are b and d fed as a user's own loop is: a torch DataLoader over the same rows
(tokenized, truncated to S, not padded), bertaccel's collator (PadCollator, its pad multiple),
its default worker count and pinned memory on a GPU, each batch copied to the device inside the
timed step. The gap between b and b' is the data's share; bertaccel's eager row is judged
against b'. (A shell needs the quote quoted: --rungs "b,b',d,d'".)"""
from __future__ import annotations

import logging
import statistics
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch

# First: it puts the repository on sys.path and sets the offline hub variables.
from vs_hf_common import (SEED, EnergyMeter, StepClock, bert_config, fixed_batches, free_memory, rows_of,
                          load_tokenizer_from, mfu_cell, package_dir, random_bert, read_rows, shuffled_subset, sync)
from bertaccel.config import CompileConfig
from bertaccel.data import encode_labels
from bertaccel.measure.flops import TokenCounts, bert_train_flops
from bertaccel.measure.memory import PeakMemory
from bertaccel.train.isolation import isolated_run
from bertaccel.train.compile_cache import compile_caches
from vs_hf_table import Row, first_line

LR = 5e-5

RUNGS = {
    "a": "fp32, eager attention, AdamW (foreach)",
    "b": "bf16 autocast, sdpa, fused AdamW",
    "c": "bf16, sdpa, fused AdamW, torch.compile",
    "d": "bf16, sdpa, fused AdamW, torch.compile reduce-overhead",
    # Our fused encoder (encoder=fused: bertaccel/encoder/) in the same hand-written loop, its
    # attention our Triton kernel over packed tokens; f: the whole step captured in one CUDA graph
    # by hand (the technique d gets from Inductor's CUDA-graph trees), the static packed layout.
    "e": "bf16, encoder=fused (ours), fused AdamW",
    "f": "bf16, encoder=fused (ours), fused AdamW, whole step in one CUDA graph",
    "b'": "b fed by a DataLoader (bertaccel's collator, workers and pinning)",
    "d'": "d fed by a DataLoader (bertaccel's collator, workers and pinning)",
}
FUSED_RUNGS = ("e", "f")
LOADER_RUNGS = ("b'", "d'")

log = logging.getLogger("vs_hf")


def rung_step(rung: str, model, device: torch.device) -> Callable[[Dict[str, torch.Tensor]], torch.Tensor]:
    """One training step of the rung on `model`: its optimizer, its torch.compile mode, its autocast
    (b' and d' step as b and d: only what feeds them differs)."""
    rung = rung.rstrip("'")
    fp32 = rung == "a"
    if fp32:
        opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    elif rung == "f":  # inside a CUDA graph: state and lr on the device
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(LR, device=device), fused=True, capturable=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    forward: Callable = model
    if rung == "c":
        forward = torch.compile(model)
    elif rung == "d":
        forward = torch.compile(model, mode="reduce-overhead")
    cudagraphs = rung == "d"
    autocast = (nullcontext if fp32 else lambda: torch.autocast(device.type, dtype=torch.bfloat16))

    def step(batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if cudagraphs:
            # Tells CUDA-graph trees a new iteration begins, so the previous step's graph
            # outputs may be reused; without it a training loop can trip "overwritten" errors.
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = forward(**batch).loss
        loss.backward()
        opt.step()
        return loss

    return graphed(step, device) if rung == "f" else step


def graphed(step: Callable[[Dict[str, torch.Tensor]], torch.Tensor], device: torch.device, warmup: int = 3):
    """`step` captured once into a CUDA graph over static input buffers and replayed:
    PyTorch's documented whole-network capture. Warm-up iterations on a side stream first (the
    allocator and the kernels' JIT), as capture requires."""
    static: Dict[str, torch.Tensor] = {}
    graph: List[Any] = []
    loss_out: List[torch.Tensor] = []

    def replay(batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if not graph:
            static.update({k: v.clone() for k, v in batch.items()})
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    step(static)
            torch.cuda.current_stream(device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # (the step zeroes the gradients first, set_to_none, as required)
                loss_out.append(step(static))
            graph.append(g)
        for k, v in batch.items():
            static[k].copy_(v)
        graph[0].replay()
        return loss_out[0]

    return replay


class Timing(NamedTuple):
    warmup_s: float
    step_ms: List[float]
    block_s: float
    kj: Any  # float | Null
    final_loss: float


def timed_steps(step: Callable, next_batch: Callable[[int], Dict[str, torch.Tensor]], device: torch.device,
                warmup_steps: int, steps: int, energy: EnergyMeter) -> Timing:
    """Unmeasured warm-up steps (compile included), then a measured block of `steps` steps.
    next_batch(i): step i's batch on the device; whatever it costs (a loader's collate and copy)
    is inside the step's time."""
    sync(device)
    t0 = time.perf_counter()
    for i in range(warmup_steps):
        step(next_batch(i))
    sync(device)
    warmup_s = time.perf_counter() - t0

    clock = StepClock(device, steps)
    e0 = energy.read_mj()
    t0 = time.perf_counter()
    clock.mark(0)
    for i in range(steps):
        loss = step(next_batch(warmup_steps + i))
        clock.mark(i + 1)
    sync(device)
    block_s = time.perf_counter() - t0
    e1 = energy.read_mj()
    step_ms = clock.step_ms()
    if device.type == "cuda":  # the GPU's own span of the block, free of the host's last sync
        block_s = clock.events[0].elapsed_time(clock.events[-1]) / 1000
    return Timing(warmup_s, step_ms, block_s, energy.kj(e0, e1), float(loss.detach()))


class LoaderFeed:
    """Batches as a user's loop gets them: a DataLoader with bertaccel's collator, worker count and
    pinning, cycled (a new pass when one ends), each batch copied to the device non-blocking.
    Keeps the host batches of the measured steps, to count the tokens they computed."""

    def __init__(self, tokenizer, texts: List[str], labels: List[int], batch: int, seq: int, count: int,
                 device: torch.device, measured_from: int):
        from torch.utils.data import DataLoader

        from bertaccel.config import TrainConfig
        from bertaccel.data.batches import PadCollator

        # bertaccel's defaults, from their one home: the schema (conf/config.yaml sets no leaf).
        train = TrainConfig()
        self.workers, self.multiple = train.num_workers, train.pad_to_multiple_of
        self.pin = device.type == "cuda"  # train.pin_memory: null resolves so
        rows = rows_of(texts, labels, batch * count)
        enc = tokenizer([t for t, _ in rows], truncation=True, max_length=seq, return_token_type_ids=False,
                        return_attention_mask=False)
        pairs = [(torch.tensor(ids, dtype=torch.int32), torch.tensor(y)) for ids, (_, y) in zip(enc["input_ids"], rows)]
        self.loader = DataLoader(pairs, batch_size=batch, shuffle=False,
                                 collate_fn=PadCollator(tokenizer.pad_token_id, self.multiple),
                                 num_workers=self.workers, pin_memory=self.pin,
                                 persistent_workers=self.workers > 0)
        self.device, self.measured_from, self.rows = device, measured_from, len(pairs)
        self.it = iter(self.loader)
        self.measured: List[Dict[str, torch.Tensor]] = []

    def __call__(self, i: int) -> Dict[str, torch.Tensor]:
        try:
            host = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            host = next(self.it)
        if i >= self.measured_from:
            self.measured.append(host)
        return {k: v.to(self.device, non_blocking=True) for k, v in host.items()}

    def note(self) -> str:
        lengths = sorted({b["input_ids"].shape[1] for b in self.measured})
        return (f"fed by DataLoader(PadCollator(pad to a multiple of {self.multiple}), workers={self.workers}, "
                f"pin_memory={self.pin}) over the {self.rows} rows of b's batches, cycled; "
                f"padded lengths of the measured batches: {', '.join(map(str, lengths))}")


def run_rung(rung: str, batches: List[Dict[str, torch.Tensor]], config, device: torch.device,
             warmup_steps: int, steps: int, profile: Optional[Dict[str, Any]], energy: EnergyMeter,
             feed: Optional[LoaderFeed] = None) -> Row:
    """feed: the DataLoader of rungs b' and d' (None: the fixed device batches)."""
    b, s = batches[0]["input_ids"].shape
    row = Row(f"{rung}/B{b}", f"plain HF loop: {RUNGS[rung]}; B={b} S={s}")
    if rung in ("d", "f", "d'") and device.type != "cuda":
        row.notes.append("skipped: CUDA graphs need a GPU")
        return row
    fp32 = rung == "a"
    memory = PeakMemory(device)
    memory.reset()
    model = random_bert(config, "eager" if fp32 else "sdpa")
    if rung in FUSED_RUNGS:
        from types import SimpleNamespace

        from bertaccel.encoder.swap import fuse_encoder

        fuse_encoder(model, SimpleNamespace(packed=True, fused_kernels=True),
                     SimpleNamespace(swap="triton", hf_implementation="eager"))
    model = model.to(device).train()
    step = rung_step(rung, model, device)

    from torch._dynamo.utils import counters

    # Dynamo's counters survive torch.compiler.reset(): this rung's share is a difference.
    graphs_before = int(counters["stats"]["unique_graphs"])
    skips_before = int(counters["inductor"]["cudagraph_skips"])
    next_batch = feed if feed is not None else (lambda i: batches[i % len(batches)])
    timing = timed_steps(step, next_batch, device, warmup_steps, steps, energy)
    peak_gib, peak_src = memory.read()

    counts = TokenCounts()
    # The encoder's layout of the last step says what it computed (encoder=fused: the packed real
    # tokens eagerly, all B*S with padding apart under the graph); Hugging Face's: the padded batch.
    # A loader's batches are padded each to its own length: every measured one is counted.
    if feed is not None:
        for host in feed.measured:
            counts.add(host)
        flops = bert_train_flops(model, counts)
    else:
        counts.add(batches[0])
        flops = bert_train_flops(model, counts) * steps
    row.cells.update({
        "ms/step": statistics.median(timing.step_ms),
        "samples/s": b * steps / timing.block_s,
        "MFU": mfu_cell(flops, timing.block_s, profile, "fp32" if fp32 else "bf16"),
        "kJ": timing.kj,
        "peak GiB": peak_gib,
        "warm-up s": timing.warmup_s,
        "final loss": timing.final_loss,
    })
    if device.type != "cuda":
        row.notes.append(f"peak: {peak_src}")
    if fp32:
        row.notes.append(f"fp32 matmul precision '{torch.get_float32_matmul_precision()}'")
    if rung in FUSED_RUNGS:
        row.notes.append(f"tokens computed: {getattr(model.base_model.encoder, 'layout', None) or 'all (no padding)'}")
    if feed is not None:
        row.notes.append(feed.note())
    if rung in ("c", "d", "d'"):
        row.notes.append(f"graphs compiled: {int(counters['stats']['unique_graphs']) - graphs_before}")
    if rung in ("d", "d'"):
        skips = int(counters["inductor"]["cudagraph_skips"]) - skips_before
        if skips:
            row.notes.append(f"CUDA graphs skipped {skips}x (see log): partly eager")
    return row


def rungs_part(args, device, profile, energy, emit) -> None:
    tok_dir = Path(args.tokenizer_dir) if args.tokenizer_dir else package_dir()
    tokenizer = load_tokenizer_from(tok_dir)
    texts, raw = read_rows(args.data, args.text_columns, args.label_column)
    labels, _, names = encode_labels(raw, raw, args.data)
    texts, labels = shuffled_subset(texts, labels, None)
    config = bert_config(args.tiny, len(tokenizer), len(names))
    for b in args.batch_sizes:
        batches = fixed_batches(tokenizer, texts, labels, b, args.seq, args.rung_batches, device)
        for rung in args.rungs:
            # Dynamo state, seeds and allocator reset per rung, and compile.cache=fresh's empty
            # per-use cache: each compiled rung pays (and reports) its own
            # cold compile; rung d would otherwise reuse rung c's graphs.
            feed = None
            with isolated_run(SEED, shared_process=True), compile_caches("", CompileConfig(cache="fresh"), device):
                try:
                    feed = (LoaderFeed(tokenizer, texts, labels, b, args.seq, args.rung_batches, device,
                                       args.warmup_steps) if rung in LOADER_RUNGS else None)
                    row = run_rung(rung, batches, config, device, args.warmup_steps, args.steps, profile, energy,
                                   feed)
                except Exception as e:  # noqa: BLE001 - one broken rung is a row, the table goes on
                    log.error(f"rung {rung} B={b} failed:\n{traceback.format_exc()}")
                    row = Row(f"{rung}/B{b}", f"plain HF loop: {RUNGS[rung]}; B={b} S={args.seq}",
                              notes=[f"failed: {first_line(e)}"])
                feed = None  # its loader workers (train.num_workers > 0) end here, not during the next rung
                free_memory()
            emit(row)
        del batches
        free_memory()
