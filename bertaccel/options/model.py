"""The `model` option's checks: its source and what that source needs (weights, a tokenizer, a
shape), and that its package or local directory is there (bertaccel/model.py check_model)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List

from bertaccel.config import MODEL_SHAPE_FIELDS, MODEL_SOURCES, ModelConfig
from bertaccel.option import not_one_of
from bertaccel.model import check_model
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def from_hub(model: ModelConfig) -> bool:
    """The weights come from the Hugging Face hub (a run needs the hub, or its local cache)."""
    return bool(model.source == "hub")


def check_model_option(model: ModelConfig) -> List[str]:
    """Why the model settings cannot work, one line each. Its source decides what else is asked:
    an unknown one is said alone; the package or directory is looked for only once named."""
    why = not_one_of("model.source", model.source, MODEL_SOURCES)
    if why:
        return [why]
    if model.source in ("package", "hub") and not model.pretrained:
        return [f"model={model.name} (source={model.source}) needs model.pretrained", *_shape(model)]
    if model.source == "random_init" and not model.tokenizer_package:
        return [f"model={model.name} (random_init) needs model.tokenizer_package", *_shape(model)]
    return problems(check_model(model)) + _shape(model)


class ModelOption(Option):
    section, schema = "model", ModelConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an unknown source; package or hub without pretrained; random_init without
        tokenizer_package or without a full shape (hidden_size divisible by num_attention_heads); a
        shape given to a pretrained model; and a package or directory that is not there."""
        return check_model_option(cfg.model)


OPTION = ModelOption()


def _shape(model: ModelConfig) -> List[str]:
    """A random-init model's shape is given in full and divides into its heads; a pretrained
    model's weights fix its shape, so none is given. One line per field."""
    if model.source != "random_init":
        return [f"model.{k}={getattr(model, k)}: model={model.name} is pretrained and its weights "
                f"fix the shape; drop model.{k}, or use a random_init model (model=tiny, "
                "model=bert_base_random)" for k in MODEL_SHAPE_FIELDS if getattr(model, k) is not None]
    missing = [f"model={model.name} (random_init) needs model.{k}: a random-init model's "
               "shape comes from the config" for k in MODEL_SHAPE_FIELDS if getattr(model, k) is None]
    hidden, heads = model.hidden_size, model.num_attention_heads  # (both set when nothing is missing)
    if not missing and hidden is not None and heads is not None and hidden % heads:
        return [f"model.hidden_size={hidden} must be divisible by model.num_attention_heads={heads}"]
    return missing
