"""compile=<mode>: torch.compile and step graphs. Its option: bertaccel/options/compile.py."""
from __future__ import annotations

from dataclasses import dataclass

COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")
COMPILE_CACHES = ("persistent", "fresh")


@dataclass
class CompileConfig:
    """Compiles the model with torch.compile, and can replay the whole step from CUDA graphs.
    Options in conf/compile/<mode>.yaml; checks in bertaccel/options/compile.py."""
    mode: str = "off"  # torch.compile's mode; off: the model runs eagerly
    # One graph for every padded length (the sequence dimension marked dynamic) instead of a
    # graph per length: one compile instead of one per length (train.pad_to_multiple_of).
    dynamic_length: bool = True
    # Where compiled kernels are kept. persistent: under cache_dir/compile/<torch, triton, GPU key>,
    # paid once per machine; fresh: an empty cache per run, for measuring cold compilation.
    cache: str = "persistent"
    # The whole optimizer step (forward, backward, clipping, update) replayed from CUDA graphs,
    # one per padded length: no host work per step (bertaccel/train/step_graph.py). GPU only.
    step_graph: bool = False
