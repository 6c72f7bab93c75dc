"""attention=<name>: the self-attention kernel. Its option: bertaccel/attention/option.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class AttentionConfig:
    """The self-attention kernel: Hugging Face's eager code or torch SDPA, or every self-attention
    swapped for xFormers' or our Triton kernel over packed tokens. Options in conf/attention/;
    checks in bertaccel/attention/option.py."""
    name: str = "eager"                # the option that set this group (attention=<name>)
    hf_implementation: str = "eager"   # The attention Hugging Face builds: eager | sdpa
    swap: Optional[str] = None         # The kernel every BertSelfAttention is then swapped for (attention/swap.py BACKENDS)
    # The torch SDPA backends allowed, in torch's names (empty = torch's own choice); sdpa only.
    sdpa_backends: List[str] = field(default_factory=list)
