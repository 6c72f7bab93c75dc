"""Layer-wise unfreezing (seed 000, section 3.2) over several epochs."""
from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.options.freezing import apply_freezing, count_trainable, layerwise_layer_index


def test_schedule_follows_the_paper_formula_mod_L():
    # L - ((e+1) mod L), with L wrapped to 0: 11, 10, ..., 1, 0, then the cycle repeats.
    assert [layerwise_layer_index(e, 12) for e in range(14)] == [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 10]
    assert [layerwise_layer_index(e, 6) for e in range(7)] == [5, 4, 3, 2, 1, 0, 5]
    for e in range(30):
        assert layerwise_layer_index(e, 12) == (12 - ((e + 1) % 12)) % 12


def _model(layers=4):
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=32, num_labels=2)
    return BertForSequenceClassification(cfg)


def test_only_the_scheduled_layer_and_the_head_train():
    model = _model(4)
    head = {n for n, _ in model.named_parameters() if not n.startswith("bert.")}
    assert head == {"classifier.weight", "classifier.bias"}
    for epoch in range(6):
        apply_freezing(model, "layerwise", epoch)
        layer = layerwise_layer_index(epoch, 4)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        expected_layer = {n for n, _ in model.named_parameters() if n.startswith(f"bert.encoder.layer.{layer}.")}
        assert trainable == head | expected_layer, f"epoch {epoch}"
        assert count_trainable(model) == sum(p.numel() for n, p in model.named_parameters() if n in trainable)
    apply_freezing(model, "none", 0)
    assert all(p.requires_grad for p in model.parameters())


def test_training_updates_only_the_scheduled_layer(compose_cfg):
    """The real loop over 3 epochs: per epoch, the optimizer rebuilt over what is trainable."""
    from bertaccel.data import PadCollator
    from bertaccel.train.loop import train

    torch.manual_seed(0)
    model = _model(4)
    samples = [(torch.randint(1, 50, (8,)), torch.tensor(i % 2)) for i in range(32)]
    loader = torch.utils.data.DataLoader(samples, batch_size=8, collate_fn=PadCollator(0))
    cfg = compose_cfg(["freezing=layerwise", "train.epochs=3", "optimizer.weight_decay=0"])

    def snapshot():
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    before = snapshot()
    result = train(model, loader, loader, cfg, torch.device("cpu"), log=lambda m: None)
    after = snapshot()
    changed_layers = {int(n.split(".")[3]) for n in before
                      if n.startswith("bert.encoder.layer.") and not torch.equal(before[n], after[n])}
    assert changed_layers == {3, 2, 1}  # epochs 0, 1, 2 -> layers 3, 2, 1 for L=4
    assert torch.equal(before["bert.encoder.layer.0.attention.self.query.weight"],
                       after["bert.encoder.layer.0.attention.self.query.weight"])
    assert torch.equal(before["bert.embeddings.word_embeddings.weight"], after["bert.embeddings.word_embeddings.weight"])
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])
    per_layer = sum(p.numel() for p in model.bert.encoder.layer[0].parameters())
    head = sum(p.numel() for p in model.classifier.parameters())
    assert [e.trainable_params for e in result.epochs] == [per_layer + head] * 3
