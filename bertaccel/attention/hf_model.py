"""How the type checker sees the parts of a built Hugging Face model that our code walks.

The swaps (attention/swap.py, encoder/swap.py), the FLOP count and the layer timing reach into a
built model by attribute: `model.base_model.encoder.layer[i].attention.self.query`. torch types
each submodule reached so as `Tensor | Module`, and the classes that hold them are Hugging Face's,
picked by the model a run names (BertLayer, RobertaLayer, ...), so no static type follows the walk.
`HFModule` names such a part: dynamically typed on purpose, at that boundary only. What our own
modules copy out of it is typed where they keep it (FusedBertLayer's nn.Linear and nn.LayerNorm).
"""
from __future__ import annotations

from typing import Any

HFModule = Any
