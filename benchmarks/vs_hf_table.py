"""vs_hf.py's table: its columns, one Row per measured configuration (plain-HF rung, Trainer epoch,
bertaccel run), and the Markdown table with the notes that say how each column was measured."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

COLUMNS = ("row", "what", "ms/step", "s/epoch", "samples/s", "MFU", "kJ", "peak GiB", "warm-up s",
           "final loss", "accuracy", "notes")
FORMATS = {"ms/step": "{:.2f}", "s/epoch": "{:.1f}", "samples/s": "{:.0f}", "MFU": "{:.3f}", "kJ": "{:.3f}",
           "peak GiB": "{:.2f}", "warm-up s": "{:.1f}", "final loss": "{:.4f}", "accuracy": "{:.4f}"}


@dataclass
class Null:
    """A figure that should exist but could not be measured here, and why."""
    reason: str


@dataclass
class Row:
    row: str
    what: str
    cells: Dict[str, Any] = field(default_factory=dict)  # column -> float | Null | absent ("-")
    notes: List[str] = field(default_factory=list)

    def render(self) -> str:
        out = [self.row, self.what]
        notes = list(self.notes)
        for col in COLUMNS[2:-1]:
            v = self.cells.get(col)
            if v is None:
                out.append("-")
            elif isinstance(v, Null):
                out.append("null")
                notes.append(f"{col} null: {v.reason}")
            else:
                out.append(FORMATS[col].format(v))
        out.append("; ".join(notes))
        return "| " + " | ".join(c.replace("|", "/") for c in out) + " |"


def header() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def table(context: str, rows: List[Row], args, store: List[str]) -> str:
    timing = ("median of per-step CUDA-event intervals (events recorded between steps, no per-step sync)"
              if args.device == "cuda" else "median of per-step perf_counter intervals (CPU ops are synchronous)")
    notes = [
        f"Rungs: {args.steps} measured steps after {args.warmup_steps} warm-up steps (warm-up s, compile "
        f"included), cycling {args.rung_batches} fixed batches of real rows from {args.data}. ms/step: {timing}; "
        "samples/s, MFU and kJ over the whole measured block (synchronized at both ends). "
        "No gradient clipping; AdamW lr 5e-5. b' and d': the same rows through a torch DataLoader (bertaccel's "
        "PadCollator, default workers, pinned on a GPU), each batch padded to its longest row rounded up to "
        "train.pad_to_multiple_of, collated and copied to the device inside the timed step: what a user's own "
        "loop pays for its data; their MFU counts the tokens of the batches they measured.",
        "MFU: analytic matmul FLOPs (bertaccel/measure/flops.py: 6*P*T + 12*L*B*S^2*H) / time / peak dense TFLOP/s of "
        "the hardware profile (rung a against peak_tflops_fp32, the others against bf16).",
        "kJ: NVML nvmlDeviceGetTotalEnergyConsumption delta over the window (whole GPU). "
        "peak GiB: torch.cuda.max_memory_allocated, reset per row.",
        "Trainer: s/epoch = wall time of trainer.train() (its setup and dataloader included), max_grad_norm 1.0 "
        "(default); MFU on the padded tokens of the batches its collator formed; final loss = epoch mean "
        "(TrainOutput.training_loss).",
        "bertaccel: metrics of bertaccel.runs.job.execute (train_time_s, step_time_ms, ...) as its Outcome returns "
        f"them, '-' = not reported; MLflow store {store[0] if store else 'as each row set tracking.uri'}.",
    ]
    return "\n".join([context, "", header(), *(r.render() for r in rows), "", *(f"- {n}" for n in notes)])
