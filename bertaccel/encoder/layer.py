"""`FusedBertLayer`: one BERT encoder layer as LightSeq built it, on packed tokens [T, D].

    qkv = x Wqkv^T + bqkv                 one GEMM for Q, K and V (bias in cuBLAS's epilogue),
                                          heads split by a view of its output (no copy)
    ctx = attention(qkv, sequence starts) a core of encoder/attention.py, no work on padding
    h   = LN(dropout(ctx Wo^T + bo) + x)  GEMM without bias, then ONE kernel: bias + dropout +
                                          residual + LayerNorm (fp32 statistics), fwd and bwd
    g   = GELU(h W1^T + b1)               GEMM without bias, then ONE kernel: bias + GELU
    y   = LN(dropout(g W2^T + b2) + h)    as for h

Hugging Face's BertLayer runs the same arithmetic as 4 GEMMs with their own bias adds, 3 more for
Q/K/V, separate dropout, add and LayerNorm kernels, and a GELU, each reading and writing the
activations again. fused_kernels=False runs the fused kernels' arithmetic as PyTorch ops instead
(the "off" of that technique).

The weights are copies of the BertLayer's (Q/K/V concatenated), and the layer's state dict speaks
Hugging Face's names (attention.self.query.weight ...): `save_pretrained` writes a checkpoint any
BertModel loads, and a BertLayer's state dict loads into this layer.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from bertaccel.attention.hf_model import HFModule
from bertaccel.attention.packing import Packing

# Our module names -> Hugging Face's BertLayer names (state dict keys, less .weight / .bias).
HF_NAMES = {"attention_output": "attention.output.dense", "attention_LayerNorm": "attention.output.LayerNorm",
            "intermediate": "intermediate.dense", "output": "output.dense", "output_LayerNorm": "output.LayerNorm"}
QKV_HF = ("attention.self.query", "attention.self.key", "attention.self.value")


def unfusable(config: HFModule) -> str:
    """Why a model of this config cannot have its layers fused (one line), or ''."""
    if getattr(config, "hidden_act", None) != "gelu":
        return (f"encoder=fused implements BERT's exact (erf) GELU; this model's hidden_act is "
                f"{getattr(config, 'hidden_act', None)!r}: use encoder=hf")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "encoder=fused is an encoder layer (no cross-attention, no KV cache): use encoder=hf"
    if config.hidden_size % config.num_attention_heads:
        return "encoder=fused: hidden_size must be a multiple of num_attention_heads"
    return ""


class FusedBertLayer(nn.Module):
    def __init__(self, src: HFModule, core: Callable[..., torch.Tensor], fused_kernels: bool = True):
        """src: a Hugging Face BERT-family layer (BertLayer's structure); core: the attention core
        function (encoder/attention.py core())."""
        super().__init__()
        attn = src.attention.self
        self.num_heads: int = attn.num_attention_heads
        self.head_dim: int = attn.attention_head_size
        hidden = self.num_heads * self.head_dim
        self.scaling = float(attn.scaling) if hasattr(attn, "scaling") else self.head_dim ** -0.5
        self.attention_dropout = float(attn.dropout.p)
        self.hidden_dropout = float(src.attention.output.dropout.p)
        self.ffn_dropout = float(src.output.dropout.p)
        self.core = core  # the attention core function (encoder/attention.py core())
        self.fused_kernels = fused_kernels
        # The four GEMMs' forward and two input gradients in FP8 (encoder/fp8_ops.py), set by precision=fp8's prepare.
        self.fp8 = False
        ref = attn.query.weight
        self.qkv = nn.Linear(hidden, 3 * hidden, device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([attn.query.weight, attn.key.weight, attn.value.weight]))
            self.qkv.bias.copy_(torch.cat([attn.query.bias, attn.key.bias, attn.value.bias]))
        self.attention_output: nn.Linear = copy.deepcopy(src.attention.output.dense)
        self.attention_LayerNorm: nn.LayerNorm = copy.deepcopy(src.attention.output.LayerNorm)
        self.intermediate: nn.Linear = copy.deepcopy(src.intermediate.dense)
        self.output: nn.Linear = copy.deepcopy(src.output.dense)
        self.output_LayerNorm: nn.LayerNorm = copy.deepcopy(src.output.LayerNorm)
        self._register_state_dict_hook(_to_hf_names)
        self._register_load_state_dict_pre_hook(_from_hf_names, with_module=True)
        self.train(src.training)

    def draws_dropout(self) -> bool:
        """Whether any of the layer's dropouts draws (and so needs a seed)."""
        return self.attention_dropout > 0 or self.hidden_dropout > 0 or self.ffn_dropout > 0

    def forward(self, hidden_states: torch.Tensor, packing: Packing, *args: Any,
                seeds: Optional[torch.Tensor] = None, x_rows: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                rows_out: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None, **kwargs: Any) -> torch.Tensor:
        """hidden_states: the packed tokens [1, T, D] (or [T, D]); packing: where the sequences start;
        seeds: int64 [3], the dropout seeds of the attention and the two LayerNorm kernels (drawn
        by each kernel's wrapper when None). With fp8 only: x_rows, hidden_states' FP8 rows (q,
        scale) if the layer before wrote them; rows_out, a list that gets this layer's output's
        (its last LayerNorm writes them in its pass, for the next layer's Q/K/V GEMM)."""
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        tokens = x.shape[0]
        training = self.training
        seed = (lambda i: None) if seeds is None else (lambda i: seeds[i:i + 1])
        if self.fp8:
            return self._forward_fp8(x, packing, seed, x_rows, rows_out).view(shape)
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias)
        ctx = self.core(qkv.view(tokens, 3, self.num_heads, self.head_dim), packing,
                        self.attention_dropout if training else 0.0, self.scaling, seed(0))
        a = F.linear(ctx.reshape(tokens, -1), self.attention_output.weight)
        h = self._add_norm(a, self.attention_output.bias, x, self.attention_LayerNorm, self.hidden_dropout, seed(1))
        i = F.linear(h, self.intermediate.weight)
        g = self._bias_gelu(i, self.intermediate.bias)
        o = F.linear(g, self.output.weight)
        y = self._add_norm(o, self.output.bias, h, self.output_LayerNorm, self.ffn_dropout, seed(2))
        return y.view(shape)

    def _forward_fp8(self, x: torch.Tensor, packing: Packing, seed: Any, x_rows: Any = None,
                     rows_out: Optional[list] = None) -> torch.Tensor:
        """forward's arithmetic with each GEMM's forward in FP8: the LayerNorm and bias+GELU kernels
        write the FP8 rows of h and g in their pass; x and the attention output are cast by a pass
        of their own. The LayerNorms' backward kernels write their input gradient's FP8 rows too,
        for the input gradients of the output projection and the second FFN GEMM (fp8_ops.py).
        Needs the fused kernels and a half residual stream (bf16 autocast)."""
        from bertaccel.encoder.fp8_ops import GradRows, bias_gelu_fp8, fp8_linear, layernorm_fp8, rowwise_fp8

        tokens = x.shape[0]
        p = self.attention_dropout if self.training else 0.0
        if x_rows is None or x_rows[0].shape != x.shape:
            x_rows = rowwise_fp8(x)
        qkv = fp8_linear(x, *x_rows, self.qkv.weight, self.qkv.bias)
        ctx = self.core(qkv.view(tokens, 3, self.num_heads, self.head_dim), packing, p, self.scaling, seed(0))
        ctx = ctx.reshape(tokens, -1)
        da_rows, do_rows = GradRows(), GradRows()
        a = fp8_linear(ctx, *rowwise_fp8(ctx), self.attention_output.weight, grad_rows=da_rows)
        norm = self.attention_LayerNorm
        h, h8, h_scale = layernorm_fp8(a, self.attention_output.bias, x, norm.weight, norm.bias,
                                       self.hidden_dropout, norm.eps, seed=seed(1), training=self.training,
                                       grad_rows=da_rows)
        i = fp8_linear(h, h8, h_scale, self.intermediate.weight)
        g, g8, g_scale = bias_gelu_fp8(i, self.intermediate.bias)
        o = fp8_linear(g, g8, g_scale, self.output.weight, grad_rows=do_rows)
        norm = self.output_LayerNorm
        y = layernorm_fp8(o, self.output.bias, h, norm.weight, norm.bias, self.ffn_dropout, norm.eps,
                          seed=seed(2), training=self.training, out_rows=rows_out is not None, grad_rows=do_rows)
        if rows_out is None:
            return y
        rows_out.append(y[1:])
        return y[0]

    def _bias_gelu(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if self.fused_kernels:
            from bertaccel.encoder.fused_ops import bias_gelu

            return bias_gelu(x, bias)
        return F.gelu(x + bias)

    def _add_norm(self, x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm,
                  p: float, seed: Optional[torch.Tensor]) -> torch.Tensor:
        p = p if self.training else 0.0
        if self.fused_kernels:
            from bertaccel.encoder.fused_ops import bias_dropout_residual_layernorm

            return bias_dropout_residual_layernorm(x, bias, residual, norm.weight, norm.bias, p, norm.eps,
                                                   seed=seed if p > 0 else None, training=self.training)
        z = F.dropout(x + bias, p, self.training) + residual
        # Under autocast layer_norm runs (and returns) fp32: back to the stream's dtype, as the kernel does.
        return F.layer_norm(z, z.shape[-1:], norm.weight, norm.bias, norm.eps).to(x.dtype)


def _to_hf_names(module: FusedBertLayer, state: Dict[str, torch.Tensor], prefix: str, _meta: Any) -> None:
    """Our keys -> BertLayer's, Q/K/V split (cloned: views of one storage would read as tied weights
    to save_pretrained, which drops tied copies)."""
    for kind in ("weight", "bias"):
        fused = state.pop(f"{prefix}qkv.{kind}")
        for name, part in zip(QKV_HF, fused.chunk(3)):
            state[f"{prefix}{name}.{kind}"] = part.clone()
        for ours, theirs in HF_NAMES.items():
            state[f"{prefix}{theirs}.{kind}"] = state.pop(f"{prefix}{ours}.{kind}")


def _from_hf_names(module: FusedBertLayer, state: Dict[str, torch.Tensor], prefix: str, *_: Any) -> None:
    """BertLayer's keys -> ours (Q/K/V concatenated); our own keys pass as they are."""
    for kind in ("weight", "bias"):
        found = [state.pop(f"{prefix}{name}.{kind}", None) for name in QKV_HF]
        parts = [p for p in found if p is not None]
        if len(parts) == len(found):
            state[f"{prefix}qkv.{kind}"] = torch.cat(parts)
        for ours, theirs in HF_NAMES.items():
            if f"{prefix}{theirs}.{kind}" in state:
                state[f"{prefix}{ours}.{kind}"] = state.pop(f"{prefix}{theirs}.{kind}")
