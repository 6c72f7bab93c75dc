"""model.build_model(start_from=...): a later build of one model in a process starts from the first
build's tensors (the plan's shared probe process times a model's build once): the same weights,
buffers included, under another attention option, without the init or the checkpoint read."""
from __future__ import annotations

import pytest
import torch

from bertaccel.model import build_model


@pytest.mark.parametrize("model", ["tiny", "minilm_l6"])
def test_a_rebuild_has_the_first_builds_tensors(compose_cfg, model):
    sdpa = compose_cfg([f"model={model}", "attention=sdpa"])
    eager = compose_cfg([f"model={model}", "attention=eager"])
    weights: dict = {}
    first, _ = build_model(sdpa.model, 4, sdpa.attention, 30522, start_from=weights)
    assert "bert.embeddings.position_ids" in weights  # a non-persistent buffer: not in a state dict
    torch.nn.init.normal_(first.classifier.weight)  # training changes the first model in place ...
    again, note = build_model(eager.model, 4, eager.attention, 30522, start_from=weights)
    assert "rebuilt" in note and again.config._attn_implementation == "eager"
    fresh, _ = build_model(sdpa.model, 4, sdpa.attention, 30522)
    assert not torch.equal(again.classifier.weight, first.classifier.weight)  # ... not the copy it kept
    rebuilt = dict(again.named_parameters())
    for name, t in first.named_parameters():
        if not name.startswith("classifier"):
            assert torch.equal(rebuilt[name], t), name
    if model == "minilm_l6":  # the checkpoint's weights, as a fresh load reads them
        assert torch.equal(rebuilt["bert.encoder.layer.0.attention.self.query.weight"],
                           dict(fresh.named_parameters())["bert.encoder.layer.0.attention.self.query.weight"])
    ids = torch.randint(1, 1000, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    first.classifier.weight.data.copy_(again.classifier.weight)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(input_ids=ids, attention_mask=mask).logits,
                                   first.eval()(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-4)


def test_a_checkpoint_saved_in_fp16_is_trained_from_fp32_parameters(compose_cfg, tmp_path):
    """transformers 5 loads a checkpoint in its saved dtype; the precision option, not the file,
    decides what a run computes in, so parameters are fp32 (AMP's master weights included)."""
    cfg = compose_cfg(["model=minilm_l6"])
    model, _ = build_model(cfg.model, 4, cfg.attention, 30522)
    model.half().save_pretrained(tmp_path / "fp16")
    local = compose_cfg(["model=minilm_l6", "model.source=hub", f"model.pretrained={tmp_path / 'fp16'}"])
    loaded, _ = build_model(local.model, 4, local.attention, 30522)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert torch.equal(loaded.bert.embeddings.word_embeddings.weight,
                       model.bert.embeddings.word_embeddings.weight.float())
