"""Where FP8 training pays: torchao's float8 (precision=fp8) against bf16, on one GPU.

    python benchmarks/fp8_ffn.py [--ffn-only | --steps-only] [--steps 30] [--batch-sizes 32,256]
                                 [--models minilm_l6,bert_base_random,bert_large_random]

1. The FFN table: one BERT FFN block (Linear d->4d, GELU, Linear 4d->d), forward and backward,
   fp32 master weights under bf16 autocast, on `tokens` x d inputs, under torch.compile. Columns:
   bf16, torchao float8 tensorwise and rowwise (compiled), and tensorwise eager (why
   precision=fp8 needs compile: rules.py fp8_compile_off). ms per fwd+bwd: the median of 5
   repeats of 20 calls timed with CUDA events, after 3 warm-up calls (compilation).
2. Whole training steps, random init, of the shapes of model=minilm_l6 (384 wide, 6 layers),
   bert_base_random (768, 12) and bert_large_random (1024, 24), read from their config options
   (`--models`; sdpa, fused AdamW, S=128, random token ids): bf16 + torch.compile against fp8
   tensorwise and rowwise + torch.compile, the layers swapped by bertaccel's own
   Precision.prepare (options/fp8.py).
   ms/step: `--steps` steps back to back in 3 CUDA-event-timed windows, the median window's mean,
   after 5 warm-up steps (compile; their wall time is the warm-up column).

Every figure of one table comes from one process on one GPU: compare within it only.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from cuda_timing import cuda_ms  # noqa: E402 (benchmarks/: the tables' one GPU timer)

SHAPES = ((768, 4096), (768, 32768), (1024, 32768), (2048, 32768), (4096, 16384))  # (d, tokens)
RECIPES = ("tensorwise", "rowwise")


def ffn(d: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).cuda()


def ffn_ms(d: int, tokens: int, recipe: Optional[str], compiled: bool) -> float:
    from bertaccel.options.fp8 import swap_to_fp8

    block = ffn(d)
    if recipe:
        swap_to_fp8(block, recipe)
    run = torch.compile(block) if compiled else block
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = run(x)
        y.backward(grad)

    ms = cuda_ms(step, warmup=3, calls=20, repeats=5)
    torch._dynamo.reset()
    return ms


def ffn_table() -> List[str]:
    rows = ["| width d, tokens | bf16 compiled (ms) | fp8 tensorwise compiled | fp8 rowwise compiled "
            "| fp8 tensorwise eager |", "|---|---|---|---|---|"]
    for d, tokens in SHAPES:
        base = ffn_ms(d, tokens, None, True)
        cells = [f"{base:.2f}"]
        for recipe, compiled in (("tensorwise", True), ("rowwise", True), ("tensorwise", False)):
            ms = ffn_ms(d, tokens, recipe, compiled)
            cells.append(f"{ms:.2f} ({base / ms:.2f}x)")
        rows.append(f"| {d}, {tokens:,} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


def model_config(model: str):
    """The Hugging Face config (random init) of a model option's shape: the project's own
    conf/model/<model>.yaml, or for a pretrained one its package's config.json."""
    from vs_hf_bertaccel import compose

    from bertaccel.config import register_configs
    from bertaccel.model import hf_config

    register_configs()
    config = hf_config(compose([f"model={model}"]).model, num_labels=2, vocab_size=30522)
    config.problem_type = "single_label_classification"
    return config


def bert_step_ms(config, batch: int, seq: int, recipe: Optional[str], steps: int) -> tuple:
    """(ms/step median, warm-up s, swap note) of training steps of a model of this Hugging Face
    config (model_config's), random init, bf16 autocast + torch.compile."""
    from transformers import BertForSequenceClassification

    from bertaccel.options.precision import Precision, load_option

    torch.manual_seed(0)
    model = BertForSequenceClassification._from_config(config, attn_implementation="sdpa").cuda().train()
    option = load_option("fp8" if recipe else "bf16")
    if recipe:
        option.fp8_recipe = recipe
    precision = Precision(option, torch.device("cuda"))
    note = precision.prepare(model)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(1, 30522, (batch, seq), device="cuda")
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (batch,), device="cuda")

    def step() -> None:
        with precision.autocast():
            loss = compiled(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    # Steps back to back as a training loop runs them (no sync between: the host queues the next
    # step while the GPU runs this one), timed in 3 windows of steps // 3; the median window.
    ms = cuda_ms(step, calls=max(1, steps // 3), repeats=3, warmup=0)
    del model, compiled, opt
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return ms, warm, note


def step_table(models: List[str], batches: List[int], steps: int, recipes: List[str]) -> List[str]:
    rows = ["| model (shape), S=128 | batch | bf16 + compile (ms/step) | "
            + " | ".join(f"fp8 {r} + compile" for r in recipes) + " |", "|---" * (3 + len(recipes)) + "|"]
    for name in models:
        c = model_config(name)
        shape = f"{name} ({c.hidden_size} wide, {c.num_hidden_layers} layers)"
        for batch in batches:
            base, warm, _ = bert_step_ms(c, batch, 128, None, steps)
            cells = [f"{base:.1f} (warm-up {warm:.0f} s)"]
            for recipe in recipes:
                ms, warm, note = bert_step_ms(c, batch, 128, recipe, steps)
                print(f"# {name} B={batch} {recipe}: {note}", flush=True)
                cells.append(f"{ms:.1f} ({base / ms:.2f}x; warm-up {warm:.0f} s)")
            rows.append(f"| {shape} | {batch} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ffn-only", action="store_true")
    ap.add_argument("--steps-only", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-sizes", default="32,256")
    ap.add_argument("--models", default="minilm_l6,bert_base_random,bert_large_random",
                    help="model options whose shapes the step table trains (conf/model/)")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="the fp8 recipes of the step table")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fp8_ffn.py needs a CUDA GPU with FP8 tensor cores (sm_89 or newer)")
    import torchao

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, torchao {torchao.__version__}, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}", flush=True)
    table = [] if args.steps_only else ffn_table()
    if not args.ffn_only:
        table += [""] + step_table(args.models.split(","), [int(b) for b in args.batch_sizes.split(",")],
                                   args.steps, args.recipes.split(","))
    print("\n".join(table))


if __name__ == "__main__":
    main()
