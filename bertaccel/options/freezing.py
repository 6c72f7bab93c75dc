"""Which parameters train in which epoch.

`layerwise` is section 3.2 of Profiling and Optimizing Training Performance of BERT-Base: the
backbone starts frozen, and at the start of epoch e only one encoder layer, plus the classifier
head, is trainable; the optimizer is then rebuilt over the trainable parameters (train/loop.py
does that every epoch).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List

from bertaccel.config import FREEZINGS, FreezingConfig, not_one_of
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


class FreezingOption(Option):
    section, schema = "freezing", FreezingConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses a strategy it does not know (FREEZINGS). With num_gpus > 1 or
        compile.step_graph=true, freezing other than none is a rule (options/rules.py)."""
        return problems(not_one_of("freezing.name", cfg.freezing.name, FREEZINGS))


OPTION = FreezingOption()


def freezes(freezing_cfg: FreezingConfig) -> bool:
    """Whether some parameters are frozen in some epoch (any strategy but none): the optimizer is
    then rebuilt per epoch over what trains, and a step graph or DDP cannot hold it."""
    return bool(freezing_cfg.name != "none")


def layerwise_layer_index(epoch: int, num_layers: int) -> int:
    """0-based index of the encoder layer trainable in (0-based) epoch `epoch`.

    The paper's formula is L - ((e + 1) mod L) with layers numbered 0..L-1. It yields L-1,
    L-2, ..., 1 for e = 0..L-2 and then L itself for e = L-1, which is no layer; we take the
    result mod L, so that epoch maps to layer 0 and the cycle L-1, ..., 0 repeats.
    Example, L=12: epochs 0,1,...,10,11,12 -> layers 11,10,...,1,0,11.
    """
    return (num_layers - ((epoch + 1) % num_layers)) % num_layers


def apply_freezing(model: Any, strategy: str, epoch: int) -> None:
    """Set requires_grad for `epoch`; the head is everything outside the backbone."""
    if strategy == "none":
        for p in model.parameters():
            p.requires_grad_(True)
        return
    if strategy != "layerwise":
        raise ValueError(f"unknown freezing strategy {strategy!r}")
    backbone = model.base_model  # model.bert for BertForSequenceClassification
    backbone_ids = {id(p) for p in backbone.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) not in backbone_ids)  # classifier head trains, backbone frozen
    layers = backbone.encoder.layer
    for p in layers[layerwise_layer_index(epoch, len(layers))].parameters():
        p.requires_grad_(True)


def count_trainable(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
