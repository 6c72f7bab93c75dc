"""Packed tokens: the padding of a batch removed once, before the first encoder layer.

BERT's layers work token by token except attention, so a batch of N rows padded to S can run as
one row of T real tokens: the projections, the feed-forward and the LayerNorms do no work on
padding, and attention needs only where each sequence starts (cu_seqlens), the way xFormers'
BlockDiagonalMask and our Triton kernel's packed mode take it. `PackedEncoder` replaces BERT's
encoder when attention=xformers|triton: it packs the embeddings once per batch, runs every
layer on the packed tokens (the swapped self-attentions receive the `Packing` where Hugging Face
passes its mask) and scatters the result back to [B, S, D] for the pooler.

Two layouts, both exact:
- "exact" (eager): only the real tokens, T = sum of lengths. Finding them (nonzero) and the
  host lengths xFormers wants cost one host sync per batch, which eager mode pays anyway.
- "static" (under CUDA-graph capture or torch.compile): the shapes may not depend on the data
  and nothing may read the device from the host. The batch's B*S tokens are permuted, real
  tokens first (row by row), then each row's padding as a sequence of its own: 2B sequences,
  none longer than S. The padding still flows through the linear layers (no FLOPs saved there),
  but attention never mixes it into real tokens and does no S x S work per row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, overload

import torch
import torch.nn.functional as F
from torch import nn

from bertaccel.attention.hf_model import HFModule


@overload
def key_padding_mask(attention_mask: torch.Tensor, bsz: int, seq: int) -> torch.Tensor: ...


@overload
def key_padding_mask(attention_mask: None, bsz: int, seq: int) -> None: ...


def key_padding_mask(attention_mask: Optional[torch.Tensor], bsz: int, seq: int) -> Optional[torch.Tensor]:
    """[B, S] bool (True = attend) from HF's mask: None; a 2-D 0/1 mask; or 4-D [B, 1, 1|S, S],
    additive float (0 = attend) or bool (True = attend). BERT's masks are key-padding masks, so
    one query row says it all. No data-dependent branch: torch.compile traces it without breaks."""
    if attention_mask is None:
        return None
    m = attention_mask
    if m.dim() == 2:
        return m != 0
    m = m[:, 0, 0, :]
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2


@dataclass
class Packing:
    """Where a batch's tokens went. index: [T] positions in the flattened [B*S] batch;
    cu_seqlens: int32 [N+1] sequence starts in the packed order; max_seqlen: a host bound on every
    sequence's length; seqlens_py: the host sequence lengths where known (exact layout), else None;
    bias: the attention backend's own per-batch object (xFormers' BlockDiagonalMask), built once.
    index None: a batch without padding, already in packed order (encoder/swap.py's uniform
    layout), which is never gathered or scattered."""
    index: Optional[torch.Tensor]
    cu_seqlens: torch.Tensor
    max_seqlen: int
    rows: int
    length: int
    seqlens_py: Optional[List[int]] = None
    bias: Any = None

    @property
    def tokens(self) -> int:
        assert self.index is not None  # read for padded batches only (attention/kernels/xformers.py)
        return int(self.index.shape[0])


def must_be_static() -> bool:
    """True where data-dependent shapes and host reads are not allowed (dynamo, graph capture).

    Dynamo is asked first: under it is_compiling() is a constant True, so the capture query is
    never traced. Dynamo cannot trace that query (a torch.* call returning a bool breaks the
    graph). Asked first, on a GPU (on a CPU is_available() is a constant False and stops it) it
    broke every compiled packed forward around pack(): a tiny fused model's 2 graphs became 14
    (the CPU with the query made untraceable, tests/test_eval_compiles.py), in frames whose
    inputs (the Packing's lengths, the packed tokens) dynamo specializes per shape, which no
    CPU test saw (H200 2026-11-28, encoder=fused compile=default: 5 compiles inside evaluation)."""
    return torch.compiler.is_compiling() or stream_capturing()


def stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA). Not traceable
    by dynamo: call it only outside a compiled region (must_be_static asks dynamo first)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def pack_exact(keep: torch.Tensor) -> Packing:
    """Only the real tokens. keep: [B, S] bool, True = a real token (any pattern, not only
    right padding: a row's tokens keep their order)."""
    rows, length = keep.shape
    lengths = keep.sum(1, dtype=torch.int32)
    # The host sync of an exact packing (T is data): the lengths come to the host first, then
    # nonzero's own sync finds the stream drained and waits for nothing.
    seqlens = lengths.tolist()
    index = keep.reshape(-1).nonzero().squeeze(1)
    cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return Packing(index, cu, max(seqlens, default=0), rows, length, seqlens)


def pack_static(keep: torch.Tensor) -> Packing:
    """All B*S tokens, real ones first, each row's padding a sequence after them; no host sync."""
    rows, length = keep.shape
    flat = keep.reshape(-1)
    # A stable sort on "is padding" keeps row-major order within the real and the padding tokens.
    index = torch.argsort((~flat).to(torch.int8), stable=True)
    lengths = keep.sum(1, dtype=torch.int32)
    cu = F.pad(torch.cumsum(torch.cat([lengths, length - lengths]), 0, dtype=torch.int32), (1, 0))
    return Packing(index, cu, length, rows, length)


def pack(keep: torch.Tensor) -> Packing:
    return pack_static(keep) if must_be_static() else pack_exact(keep)


def pack_tokens(hidden: torch.Tensor, packing: Packing) -> torch.Tensor:
    """[B, S, D] -> [1, T, D]: one row of the packed tokens (BERT's layers keep their 3-D shapes)."""
    assert packing.index is not None  # a padded batch's packing: it has an index
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, packing.index).unsqueeze(0)


def unpack_tokens(packed: torch.Tensor, packing: Packing) -> torch.Tensor:
    """[1, T, D] -> [B, S, D], padding positions 0 (exact layout) or their own values (static)."""
    assert packing.index is not None  # a padded batch's packing: it has an index
    flat = packed.new_zeros(packing.rows * packing.length, packed.shape[-1])
    return flat.index_copy(0, packing.index, packed[0]).view(packing.rows, packing.length, -1)


# The name Hugging Face's mask builder is told the swapped model's attention goes by.
MASK_PASSTHROUGH = "bertaccel_packed"


def _mask_as_given(batch_size: int, q_length: int, kv_length: int, attention_mask: Optional[torch.Tensor] = None,
                   **kwargs: Any) -> Optional[torch.Tensor]:
    return attention_mask


def _sdpa_with_key_padding(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                           scaling: Optional[float] = None, **kwargs: Any):
    """The attention a model built from the swapped model's config elsewhere runs (the plan builds
    one on the meta device for its FLOP count): sdpa over the [B, S] key-padding mask this name's
    mask builder hands through. The swapped model itself never calls it."""
    mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def pass_masks_through(model: HFModule) -> None:
    """Have BertModel hand the encoder the [B, S] padding mask as given (as bool), not the 4-D
    additive mask eager attention needs: that one is never used here, costs a [B, 1, S, S] tensor
    per batch, and its builder copies a host scalar to the device, which CUDA-graph capture forbids
    (compile.step_graph failed on it). Registered under our own name, with an attention function
    beside it, so Hugging Face accepts a config that names it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register(MASK_PASSTHROUGH, _mask_as_given)
    AttentionInterface.register(MASK_PASSTHROUGH, _sdpa_with_key_padding)
    model.config._attn_implementation = MASK_PASSTHROUGH


class PackedEncoder(nn.Module):
    """BERT's encoder on packed tokens. Holds the same `layer` list (state-dict keys unchanged) and
    runs Hugging Face's own loop over it (`layers_forward`, the wrapped encoder class's forward, a
    plain function of the module: it reads only `self.layer`, so DataParallel replicas run their
    own layers); activation checkpointing's segments replace that function (train/checkpointing.py)."""

    def __init__(self, encoder: HFModule, prepare: Callable[[Packing], Any]):
        super().__init__()
        self.config = encoder.config
        self.layer = encoder.layer
        self.layers_forward = type(encoder).forward
        self.prepare = prepare
        # The layout the last padded batch was packed in (exact / static), for the FLOP count
        # (measure/flops.py): the work done is the real tokens' eagerly, the padded batch's in graphs.
        self.layout: Optional[str] = None

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                *args: Any, **kwargs: Any):
        if attention_mask is None:  # no padding: every layer runs dense, no mask at all
            return self.layers_forward(self, hidden_states, None, *args, **kwargs)
        keep = key_padding_mask(attention_mask, *hidden_states.shape[:2])
        packing = pack(keep)
        packing.bias = self.prepare(packing)
        self.layout = "exact" if packing.seqlens_py is not None else "static"
        out = self.layers_forward(self, pack_tokens(hidden_states, packing), packing, *args, **kwargs)
        out.last_hidden_state = unpack_tokens(out.last_hidden_state, packing)
        return out
