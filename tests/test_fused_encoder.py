"""encoder=fused: our fused BERT layer (bertaccel/encoder/) against Hugging Face's BertLayer on the
same weights, on ragged packed batches; the model around it stays Hugging Face's (save/reload);
the option's checks, machine check, FLOP count and checkpointing. CPU: the Triton kernels run in
Triton's interpreter (conftest.py sets TRITON_INTERPRET=1), at tiny sizes."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.attention.packing import pack_exact
from bertaccel.config import ConfigError
from bertaccel.encoder.layer import FusedBertLayer
from bertaccel.attention.option import fused_core_name as core_for
from bertaccel.encoder.swap import FusedEncoder, fuse_encoder
from bertaccel.options.checks import validate

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # Triton runs on CPU tensors only in the interpreter
# The training runs here keep sequences short and batches small: Triton's interpreter runs each
# kernel program in Python (attention: one per sequence and head), so a run's time grows with the
# tokens and rows (a 2-rank data-parallel step took 231 s at the default 128 tokens, 45 s at 32),
# and what these tests check (the fused path trains with the other techniques, the steps counted,
# the weights move) depends on neither.
SHORT = ["dataset.max_length=16", "train.batch_size=4", "train.eval_batch_size=4"]
LENGTHS = [9, 1, 5]  # ragged: a single token, and rows padded in a batch of 9


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    return BertConfig(**base)


def reference_core(qkv, packing, p, scale, seed=None):
    """Per-sequence softmax attention in plain torch over the packed [T, 3, H, D] projection."""
    assert p == 0.0
    bounds = packing.cu_seqlens.tolist()
    out = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        q, k, v = (t.transpose(0, 1) for t in qkv[start:end].unbind(1))  # [H, L, D]
        out.append((torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v).transpose(0, 1))
    return torch.cat(out)


def _options(fused_kernels=True, packed=True, attention="eager"):
    from types import SimpleNamespace

    enc = SimpleNamespace(name="fused", layer="fused", packed=packed, fused_kernels=fused_kernels, half_params=False)
    att = SimpleNamespace(name=attention, swap="triton" if attention == "triton" else None,
                          hf_implementation="sdpa" if attention == "sdpa" else "eager")
    return enc, att


def _models(fused_kernels=True, packed=True, seed=0):
    torch.manual_seed(seed)
    hf = BertForSequenceClassification._from_config(tiny_config(), attn_implementation="eager").to(DEVICE)
    fused = copy.deepcopy(hf)
    fuse_encoder(fused, *_options(fused_kernels, packed))
    return hf, fused


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 64, (len(LENGTHS), max(LENGTHS)), generator=g)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


@pytest.mark.parametrize("core", ["reference", "triton"])
@pytest.mark.parametrize("fused_kernels", [False, True])
def test_fused_layer_matches_bert_layer_outputs_and_gradients(core, fused_kernels):
    hf = BertForSequenceClassification._from_config(tiny_config(), attn_implementation="eager").to(DEVICE)
    src = hf.bert.encoder.layer[0].train()  # dropout 0: training mode computes the same function
    from bertaccel.encoder.attention import core

    layer = FusedBertLayer(src, reference_core if core == "reference" else core("triton"), fused_kernels)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(1, n, 32, generator=g).to(DEVICE) for n in LENGTHS]
    # Hugging Face's layer one sequence at a time (no padding, no mask); ours on the packed tokens.
    hf_in = [r.clone().requires_grad_() for r in rows]
    outs = [src(r) for r in hf_in]  # transformers 5.17 returns a tuple, 5.24 the tensor
    hf_out = torch.cat([o[0] if isinstance(o, tuple) else o for o in outs], 1)
    packed_in = torch.cat(rows, 1).requires_grad_()
    keep = torch.ones(1, sum(LENGTHS), dtype=torch.bool, device=DEVICE)
    packing = pack_exact(keep)
    packing.cu_seqlens = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32,
                                      device=DEVICE)
    packing.max_seqlen = max(LENGTHS)
    out = layer(packed_in, packing)
    torch.testing.assert_close(out, hf_out, rtol=1e-4, atol=1e-5)
    weight = torch.randn(out.shape, generator=g).to(DEVICE)
    (hf_out * weight).sum().backward()
    (out * weight).sum().backward()
    torch.testing.assert_close(packed_in.grad, torch.cat([r.grad for r in hf_in], 1), rtol=1e-4, atol=1e-5)
    attn = src.attention.self
    torch.testing.assert_close(layer.qkv.weight.grad,
                               torch.cat([attn.query.weight.grad, attn.key.weight.grad, attn.value.weight.grad]),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(layer.qkv.bias.grad,
                               torch.cat([attn.query.bias.grad, attn.key.bias.grad, attn.value.bias.grad]),
                               rtol=1e-4, atol=1e-5)
    for ours, theirs in ((layer.attention_output, src.attention.output.dense),
                         (layer.attention_LayerNorm, src.attention.output.LayerNorm),
                         (layer.intermediate, src.intermediate.dense), (layer.output, src.output.dense),
                         (layer.output_LayerNorm, src.output.LayerNorm)):
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.bias.grad, theirs.bias.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
@pytest.mark.parametrize("packed", [True, False])
def test_fused_model_gives_hugging_faces_logits_and_gradients_on_padded_batches(packed):
    hf, fused = _models(fused_kernels=True, packed=packed)
    ids, mask = _batch()
    labels = torch.tensor([0, 2, 1], device=DEVICE)
    for model in (hf, fused):
        model.train()  # dropout 0: the training path, the same function
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    torch.testing.assert_close(fused(input_ids=ids, attention_mask=mask).logits,
                               hf(input_ids=ids, attention_mask=mask).logits, rtol=1e-4, atol=1e-5)
    emb = "bert.embeddings.word_embeddings.weight"
    torch.testing.assert_close(dict(fused.named_parameters())[emb].grad, dict(hf.named_parameters())[emb].grad,
                               rtol=1e-4, atol=1e-6)
    assert fused.bert.encoder.layout == ("exact" if packed else "static")
    # A batch without padding runs as B sequences of S, nothing gathered.
    full = torch.ones_like(mask)
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids, attention_mask=full).logits,
                                   hf(input_ids=ids, attention_mask=full).logits, rtol=1e-4, atol=1e-5)


def test_fused_model_saves_and_reloads_as_a_hugging_face_model(tmp_path):
    hf, fused = _models()
    ids, mask = _batch()
    with torch.no_grad():
        fused.bert.encoder.layer[1].qkv.bias.add_(0.5)  # "trained": differs from the source model
        expected = fused.eval()(input_ids=ids, attention_mask=mask).logits
    fused.save_pretrained(tmp_path)
    reloaded = BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager").to(DEVICE).eval()
    assert type(reloaded.bert.encoder).__name__ == "BertEncoder"  # a plain Hugging Face model
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).logits, expected,
                                   rtol=1e-4, atol=1e-5)
    # ... and a Hugging Face state dict loads into the fused model (Q/K/V concatenated).
    again = _models(seed=7)[1].eval()
    again.load_state_dict(reloaded.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids, attention_mask=mask).logits, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["every", "sqrt"])
def test_checkpointing_gives_the_same_gradients_with_dropout(mode):
    from bertaccel.train.checkpointing import apply_checkpointing

    torch.manual_seed(0)
    hf = BertForSequenceClassification._from_config(
        tiny_config(num_hidden_layers=4, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)).to(DEVICE)
    plain = copy.deepcopy(hf)
    fuse_encoder(plain, *_options())
    ckpt = copy.deepcopy(plain)
    apply_checkpointing(ckpt, mode)
    ids, mask = _batch()
    labels = torch.tensor([0, 2, 1], device=DEVICE)
    for model in (plain, ckpt):
        torch.manual_seed(5)  # the same dropout seeds drawn in both
        model.train()(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_flops_count_the_fused_qkv_as_the_layers_input_projection():
    from bertaccel.measure.flops import TokenCounts, bert_train_flops

    hf, fused = _models()
    ids, mask = _batch()
    counts = TokenCounts()
    counts.add({"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(3, dtype=torch.long, device=DEVICE)})
    fused.bert.encoder.layout = None  # padded shapes: the two models count the same work
    assert bert_train_flops(fused, counts) == bert_train_flops(hf, counts)
    for model in (hf, fused):  # frozen lower layers: the backward stops at the Q/K/V inputs
        for p in model.bert.embeddings.parameters():
            p.requires_grad_(False)
        for p in model.bert.encoder.layer[0].parameters():
            p.requires_grad_(False)
    assert bert_train_flops(fused, counts) == bert_train_flops(hf, counts)
    fused(input_ids=ids, attention_mask=mask)  # eager, packed: the real tokens only
    assert fused.bert.encoder.layout == "exact" and bert_train_flops(fused, counts) < bert_train_flops(hf, counts)


def test_core_follows_the_attention_option():
    from types import SimpleNamespace as NS

    assert core_for(NS(swap=None, hf_implementation="eager")) == "triton"
    assert core_for(NS(swap=None, hf_implementation="sdpa")) == "sdpa"
    assert core_for(NS(swap="xformers", hf_implementation="eager")) == "xformers"


def test_a_model_with_another_activation_is_refused_in_one_line():
    model = BertForSequenceClassification._from_config(tiny_config(hidden_act="gelu_new"))
    with pytest.raises(ValueError, match="hidden_act is 'gelu_new': use encoder=hf"):
        fuse_encoder(model, *_options())


def test_encoder_option_composes_builds_and_refuses_what_cannot_apply(compose_cfg):
    from bertaccel.model import build_model

    cfg = compose_cfg(["model=tiny", "encoder=fused", "attention=triton"])
    validate(cfg)
    model, note = build_model(cfg.model, 4, cfg.attention, 128, cfg.encoder)
    model.to(DEVICE)
    assert isinstance(model.bert.encoder, FusedEncoder) and "2 layers fused (attention core triton)" in note
    assert compose_cfg([]).encoder.layer == "hf"  # the default: Hugging Face's layer
    with pytest.raises(ConfigError, match=r"encoder.packed=False applies to encoder=fused only"):
        validate(compose_cfg(["encoder=hf", "encoder.packed=false"]))
    with pytest.raises(ConfigError, match=r"encoder.layer='lightseq' is not one of hf, fused"):
        validate(compose_cfg(["encoder=fused", "encoder.layer=lightseq"]))


def test_encoder_fused_on_a_cpu_is_skipped_with_its_reason(compose_cfg, monkeypatch):
    from bertaccel.options.hardware import probe, skip_reason

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    reason = skip_reason(compose_cfg(["encoder=fused"]), cpu, probe())
    assert reason == ("encoder=fused needs a CUDA GPU; on a CPU its Triton kernels only run in Triton's interpreter "
                      "(TRITON_INTERPRET=1), which is for correctness tests, not training")
    assert skip_reason(compose_cfg(["encoder=hf"]), cpu, probe()) is None


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_half_params_needs_fused_half_precision_and_a_master_weight_optimizer(compose_cfg):
    from bertaccel.encoder.option import half_params
    from bertaccel.options.optimizer import optimizer_class

    class Masters:
        master_weights = True

    cfg = compose_cfg(["encoder=fused", "precision=bf16"])
    assert half_params(cfg, Masters)
    assert not half_params(cfg, optimizer_class(compose_cfg(["optimizer=adamw"]).optimizer))  # torch's: no masters
    assert not half_params(compose_cfg(["encoder=fused", "precision=fp32"]), Masters)
    assert not half_params(compose_cfg(["encoder=fused", "precision=bf16", "encoder.half_params=false"]), Masters)
    assert not half_params(compose_cfg(["encoder=hf", "precision=bf16"]), Masters)
    assert not half_params(compose_cfg(["encoder=fused", "precision=fp16"]), Masters)  # clipping under GradScaler
    assert half_params(compose_cfg(["encoder=fused", "precision=fp16", "optimizer.max_grad_norm=null"]), Masters)
    assert half_params(cfg, optimizer_class(compose_cfg(["optimizer=adamw_fused"]).optimizer))  # ours keeps masters
    assert not half_params(cfg, optimizer_class(compose_cfg(["optimizer=adamw_torch_fused"]).optimizer))


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip is a CPU machine's (a GPU runs both)")
def test_a_fused_run_trains_end_to_end_and_a_cpu_sweep_skips_it_with_the_reason(cli, monkeypatch):
    """The real CLI: in Triton's interpreter (this CPU, TRITON_INTERPRET=1) encoder=fused trains and
    records its metrics and FLOPs; without the interpreter a sweep records it skipped, and goes on."""
    from conftest import TINY

    from bertaccel.record.tracking import runs_by_status

    r = cli([*TINY, "encoder=fused", "train.max_steps_per_epoch=3", "dataset.test_subset=8", *SHORT])
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = runs_by_status(cli.store, "bertaccel")["finished"]
    assert run.data.params["encoder"] == "fused"
    assert run.data.metrics["optimizer_steps"] == 3 and 0 <= run.data.metrics["test_accuracy"] <= 1
    assert run.data.metrics["padded_tokens"] >= run.data.metrics["real_tokens"] > 0
    assert "encoder=fused" in run.data.tags["model_flops_source"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the run processes inherit the environment: a plain CPU now
    r = cli(["-m", *TINY, "encoder=hf,fused", "train.max_steps_per_epoch=2", "dataset.test_subset=8", *SHORT,
             "tracking.experiment=sweep"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 runs: finished=1 skipped=1 failed=0" in r.stdout
    (skipped,) = runs_by_status(cli.store, "sweep")["skipped"]
    assert skipped.data.tags["reason"].startswith("encoder=fused needs a CUDA GPU")


def test_step_graph_with_hugging_faces_eager_attention_is_refused_in_one_line(compose_cfg):
    with pytest.raises(ConfigError, match="Hugging Face's eager mask builder copies a host scalar"):
        validate(compose_cfg(["compile.step_graph=true", "attention=eager"]))
    validate(compose_cfg(["compile.step_graph=true", "attention=eager", "encoder=fused"]))  # ours: no such copy
    validate(compose_cfg(["compile.step_graph=true", "attention=sdpa"]))


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["freezing=layerwise", "accumulation=2", "train.epochs=2", "train.gradient_checkpointing=sqrt"],
    ["num_gpus=2", "accumulation=2"],  # on a CPU: two gloo rank processes, DDP over the fused layers
], ids=["freezing-accumulation-checkpointing", "data-parallel"])
def test_fused_runs_with_the_other_techniques(cli, overrides):
    from conftest import TINY

    from bertaccel.record.tracking import runs_by_status

    # One step an epoch of 4 rows (2 micro-batches of 2), 8 test rows (2 batches: one per rank under
    # data parallel; its warm-up runs 4 micro-steps of a whole batch on each rank): Triton's
    # interpreter runs every kernel program in Python.
    r = cli([*TINY, "encoder=fused", "train.max_steps_per_epoch=1", "dataset.test_subset=8", *SHORT, *overrides])
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = runs_by_status(cli.store, "bertaccel")["finished"]
    epochs = 2 if "train.epochs=2" in overrides else 1
    assert run.data.metrics["optimizer_steps"] == epochs and run.data.metrics["test_accuracy"] >= 0


@pytest.mark.slow
@pytest.mark.parametrize("half", [True, False])
def test_half_parameters_train_with_the_optimizers_fp32_masters(compose_cfg, tmp_path, half):
    """encoder.half_params: train() keeps the parameters in bf16 (the optimizer's flat buffers hold
    their fp32 masters), and the weights move; off, they stay fp32 under autocast."""
    from conftest import tiny_training

    from bertaccel.train.loop import train

    # One step of 4 rows, 8 test rows (SHORT): the check is the dtypes and that the weights move (lr is
    # the full lr at step 0: warm-up of ceil(0.1 x 1) step). Each step's fused AdamW kernel runs over
    # the whole flat buffer (the 30k-row embedding too) in Triton's interpreter: most of the time.
    cfg = compose_cfg(["model=tiny", f"train.device={DEVICE}", "dataset.train_subset=16", "dataset.test_subset=8",
                       "encoder=fused", "precision=bf16", "optimizer=adamw_fused",
                       "train.max_steps_per_epoch=1", f"encoder.half_params={str(half).lower()}", *SHORT,
                       f"cache_dir={tmp_path}"])
    model, (train_loader, test_loader), _ = tiny_training(cfg)
    before = model.bert.encoder.layer[0].qkv.weight.detach().float().clone()
    result = train(model, train_loader, test_loader, cfg, torch.device(DEVICE), log=lambda _: None)
    dtypes = {p.dtype for p in model.parameters()}
    assert dtypes == ({torch.bfloat16} if half else {torch.float32})
    assert result.epochs[-1].train_loss == pytest.approx(result.epochs[-1].train_loss)  # finite
    assert not torch.equal(model.bert.encoder.layer[0].qkv.weight.detach().float(), before)
