"""Compiled encoder=fused runs compile nothing inside evaluation (issue 62, item 5).

On an H200 (2026-11-28) `encoder=fused compile=default compile.step_graph=true` counted 5 compiles
inside evaluation, where every CPU test counted none. The two machines traced different code:
attention/packing.py's must_be_static asked `torch.cuda.is_current_stream_capturing()` before
`torch.compiler.is_compiling()`. On a CPU `torch.cuda.is_available()` is a constant False to
dynamo and the query never ran; on a GPU dynamo cannot trace it (a torch.* call returning a bool)
and broke the compiled forward around pack() into many frames, each specialized per shape.

Here the CPU meets what dynamo meets on a GPU: `gpu_capture_query` gives packing.py a torch whose
cuda says it is available and whose capture query breaks dynamo's graph as the real one does on a
GPU (everything else is the real torch). CPU: the fused kernels run in Triton's interpreter
(conftest.py sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import types

import pytest
import torch
from conftest import tiny_training

from bertaccel.attention import packing
from bertaccel.config import CompileConfig
from bertaccel.train.compile_cache import compile_caches
from bertaccel.train.loop import train
from bertaccel.train.warmup import WarmupPlan, data_lengths

pytest.importorskip("triton")

CPU = torch.device("cpu")


@pytest.fixture
def gpu_capture_query(monkeypatch):
    """packing.py's view of torch as on a GPU: cuda available, and a capture query that dynamo
    cannot trace (it breaks the graph there). Returns the query's state: its answer (False: not
    capturing) and its calls."""
    answer = {"capturing": False, "calls": 0}

    def is_current_stream_capturing() -> bool:
        torch._dynamo.graph_break()  # what dynamo does with the real query on a GPU
        answer["calls"] += 1
        return answer["capturing"]

    cuda = types.ModuleType("torch.cuda_as_on_a_gpu")
    cuda.is_available = lambda: True
    cuda.is_current_stream_capturing = is_current_stream_capturing
    # A module named torch.*: dynamo traces the frames that use it, as it does the real torch.
    as_on_a_gpu = types.ModuleType("torch.as_on_a_gpu")
    as_on_a_gpu.__dict__.update({k: v for k, v in vars(torch).items() if not k.startswith("__")})
    as_on_a_gpu.cuda = cuda
    monkeypatch.setattr(packing, "torch", as_on_a_gpu)
    return answer


def test_compiled_packing_asks_dynamo_first_and_capture_only_outside(gpu_capture_query):
    """Under dynamo the packed layout is decided without the capture query (no graph break);
    outside it the query still decides (CUDA-graph capture of an eager step packs statically)."""
    from test_fused_encoder import _batch, _models

    _, fused = _models()
    fused.eval()
    ids, mask = _batch()
    explained = torch._dynamo.explain(fused)(input_ids=ids, attention_mask=mask)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
    assert fused.bert.encoder.layout == "static"
    assert gpu_capture_query["calls"] == 0
    # Eager: the query decides, as before.
    assert packing.must_be_static() is False and gpu_capture_query["calls"] == 1
    gpu_capture_query["capturing"] = True
    assert packing.must_be_static() is True


def _compiled_run(compose_cfg, tmp_path, encoder: str):
    # Evaluation batches of another size than training's, a length training has not, and a short
    # last evaluation batch (44 rows in batches of 8: filler rows).
    cfg = compose_cfg(["model=tiny", "train.device=cpu", "dataset.train_subset=8", "dataset.test_subset=44",
                       "train.batch_size=4", "train.eval_batch_size=8", "train.pad_to_multiple_of=16",
                       "dataset.max_length=64", "train.max_steps_per_epoch=1", f"encoder={encoder}",
                       "compile=default", f"cache_dir={tmp_path}"])
    model, (tr, te), data = tiny_training(cfg)
    plan = WarmupPlan(4, 8, data_lengths(data.train.lengths, 16), data_lengths(data.test.lengths, 16))
    torch.compiler.reset()
    lines = []
    with compile_caches(cfg.cache_dir, CompileConfig(cache="fresh"), CPU):
        result = train(model, tr, te, cfg, CPU, log=lines.append, warmup_plan=plan)
    return result, plan, model, lines


@pytest.mark.slow
def test_compiled_fused_run_compiles_nothing_inside_evaluation(compose_cfg, tmp_path, gpu_capture_query):
    result, plan, model, lines = _compiled_run(compose_cfg, tmp_path, "fused")
    assert set(plan.eval_lengths) - set(plan.train_lengths), plan.describe()
    assert result.compiled_anything and result.compile_time_s > 0
    assert result.compiles_in_eval == 0, [m for m in lines if "inside the evaluation" in m]
    assert result.recompiles_in_window == 0
    # One training graph and one evaluation graph (dynamic length): the whole model in one graph
    # each, as on a CPU. With the capture query asked first it was 14 (graph breaks around pack()).
    assert result.compile_graphs == 2
    assert model.bert.encoder.layout == "static"  # the compiled layout, no data-dependent token count


@pytest.mark.slow
def test_compiled_hf_run_compiles_nothing_inside_evaluation(compose_cfg, tmp_path):
    result, _, _, lines = _compiled_run(compose_cfg, tmp_path, "hf")
    assert result.compiled_anything
    assert result.compiles_in_eval == 0, [m for m in lines if "inside the evaluation" in m]
    assert result.recompiles_in_window == 0
