"""Kernel profile: categories of real kernel/operator names, and the roll-up of a real CPU profile."""
from __future__ import annotations

import gzip
import json

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.measure.profiling import CATEGORIES, categorize, profile_steps, write_report


@pytest.mark.parametrize("name,category", [
    ("aten::addmm", "gemm"),
    ("aten::mm", "gemm"),
    ("aten::bmm", "gemm"),  # eager attention's batched GEMMs count as GEMM, as in seed 003
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("ampere_sgemm_128x64_tn", "gemm"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("aten::_softmax", "attention"),
    ("aten::_log_softmax", "elementwise"),  # the loss, not attention
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("aten::_foreach_norm", "optimizer"),
    ("aten::native_layer_norm", "elementwise"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u>", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "elementwise"),
    ("triton_poi_fused_add_native_layer_norm_0", "elementwise"),
    ("aten::embedding_dense_backward", "other"),
    # Every TensorIterator kernel has a "lambda" in its signature: not the LAMB optimizer.
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const>", "elementwise"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t"
     "<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()"
     "(at::TensorIterator&)::{lambda(float, float)#1}>>>", "elementwise"),
    ("lamb_stage1_kernel", "optimizer"),
])
def test_categorize(name, category):
    assert categorize(name) == category


def test_rollup_of_a_real_cpu_profile(tmp_path):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, num_labels=3, attn_implementation="eager")
    model = BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    batches = [{"input_ids": torch.randint(1, 200, (8, 32)), "attention_mask": torch.ones(8, 32, dtype=torch.long),
                "labels": torch.randint(0, 3, (8,))} for _ in range(5)]

    def step(batch):
        loss = F.cross_entropy(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                               batch["labels"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    kp = profile_steps(step, batches, torch.device("cpu"), warmup=1, active=3, out_dir=tmp_path, top_k=10)
    assert kp.steps == 3 and kp.timeline == "cpu operators"
    assert set(kp.shares) == set(CATEGORIES)
    assert sum(kp.shares.values()) == pytest.approx(1.0)
    assert kp.shares["gemm"] > 0.05
    # Non-foreach AdamW is plain sqrt/mul/add ops: attributed to the optimizer by the
    # Optimizer.step record_function around them, not by their names.
    assert kp.shares["optimizer"] > 0.02
    assert 0 < len(kp.top) <= 10
    assert [r.self_time_us for r in kp.top] == sorted((r.self_time_us for r in kp.top), reverse=True)
    assert not any(r.name.startswith("ProfilerStep") for r in kp.top)
    with gzip.open(kp.trace_path, "rt") as f:
        assert "traceEvents" in json.load(f)
    md, js = write_report(kp, tmp_path)
    assert "| gemm |" in md.read_text() and json.loads(js.read_text())["steps"] == 3


def test_too_few_steps_for_the_window_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="only 2 step"):
        profile_steps(lambda b: None, [1, 2], torch.device("cpu"), warmup=2, active=3, out_dir=tmp_path)
