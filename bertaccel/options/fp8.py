"""precision=fp8: Hugging Face's nn.Linear layers swapped for torchao's Float8Linear (its float8
training: the three GEMMs of each Linear, forward and both backward, in FP8 through
torch._scaled_mm with dynamic scaling; everything else runs under bf16 autocast).

torchao is an optional extra (pip install 'bertaccel[fp8]'), imported only here and only when a
run asks for FP8 (options/precision.py Precision.prepare); that module says why a machine cannot run it before this is reached.
"""
from __future__ import annotations

from typing import List

import torch

FP8_RECIPES = ("tensorwise", "rowwise")  # the torchao Float8LinearRecipeName values precision.fp8_recipe takes


def fp8_eligible(module: torch.nn.Module) -> bool:
    """Whether a layer is swapped: a plain nn.Linear (not one swapped already: Float8Linear is an
    nn.Linear too) whose both dims are multiples of 16. torch._scaled_mm, the FP8 GEMM, refuses
    other shapes; that leaves out the classifier head (num_labels outputs), which is also too small
    for FP8 to pay for its casts and where the loss is most sensitive to rounding."""
    return (type(module) is torch.nn.Linear and module.in_features % 16 == 0
            and module.out_features % 16 == 0)


def swap_to_fp8(model: torch.nn.Module, recipe: str) -> List[str]:
    """Swaps every eligible nn.Linear of `model` in place for torchao's Float8Linear with `recipe`
    (tensorwise: one scale per tensor; rowwise: one per row, power-of-2 scales, more accurate and
    slower); returns the swapped layers' names. A model swapped already is left as it is."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    swapped: List[str] = []

    def keep(module: torch.nn.Module, name: str) -> bool:
        if fp8_eligible(module):
            swapped.append(name)
            return True
        return False

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=keep)
    return swapped
