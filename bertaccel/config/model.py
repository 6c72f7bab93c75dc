"""model=<name>: the BERT to fine-tune. Its option: bertaccel/options/model.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from bertaccel.option import bounded

MODEL_SOURCES = ("package", "hub", "random_init")


@dataclass
class ModelConfig:
    """The BERT model to fine-tune and where its weights come from. Options in conf/model/; checks
    in bertaccel/options/model.py."""
    name: str = MISSING  # the option that set this group (model=<name>)
    # Where the weights come from. package: a pip package; hub: the Hugging Face hub; random_init:
    # new weights, of the shape below
    source: str = MISSING
    # The weights. package: an importable package holding them in <package>/model; hub: a hub id.
    pretrained: Optional[str] = None
    # The package a random_init model takes its tokenizer from. The shape below is random_init's
    # too: null for a pretrained model, whose weights bring their own shape (a run logs the built
    # model's shape as params model.<field>, job.py, never a default that was not used).
    tokenizer_package: Optional[str] = None
    hidden_size: Optional[int] = bounded(None, gt=0)  # Hidden size of a random_init model
    num_hidden_layers: Optional[int] = bounded(None, gt=0)  # Encoder layers of a random_init model
    num_attention_heads: Optional[int] = bounded(None, gt=0)  # Attention heads of a random_init model
    intermediate_size: Optional[int] = bounded(None, gt=0)  # Feed-forward width of a random_init model


# The ModelConfig fields that give a random-init model its shape (also its Hugging Face config's names).
MODEL_SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
