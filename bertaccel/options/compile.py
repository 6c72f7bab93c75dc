"""The `compile` option, in one place: torch.compile's mode and kernel cache (conf/compile/<mode>.yaml),
its checks, what this machine needs to compile, and the predicates the run asks (`compiles`,
`uses_cuda_graphs`). compile.step_graph=true (the whole step replayed from CUDA graphs,
bertaccel/train/step_graph.py) is checked here against the mode; what it cannot be combined with
in other sections is options/rules.py's."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

from bertaccel.config import COMPILE_CACHES, COMPILE_MODES, CompileConfig
from bertaccel.option import not_one_of
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    import torch

    from bertaccel.config import RunConfig


def compiles(compile_cfg: CompileConfig) -> bool:
    """Whether the model runs through torch.compile (any mode but off)."""
    return compile_cfg.mode != "off"


def torch_compile_mode(compile_cfg: CompileConfig) -> Optional[str]:
    """The mode torch.compile is called with: None for compile=default (torch's own default)."""
    return None if compile_cfg.mode == "default" else compile_cfg.mode


def keeps_cache(compile_cfg: CompileConfig) -> bool:
    """compile.cache=persistent: compiled kernels are kept for later runs (not an empty cache per run)."""
    return compile_cfg.cache == "persistent"


def logged_mode(text: Any) -> str:
    """compile.mode as a logged run or a sweep's override gives it back: YAML 1.1 reads a bare
    `off` as false, so a run composed from `compile: off` logged "False"; "" stays "" (unknown)."""
    text = str(text)
    return "off" if text.lower() in ("false", "off") else text


def uses_cuda_graphs(mode: str) -> bool:
    """Whether this torch.compile mode replays CUDA graphs (reduce-overhead, max-autotune): read
    from Inductor's own table of modes, so a mode that gains or drops graphs is followed here."""
    if mode in ("off", "default"):
        return False
    from torch._inductor import list_mode_options

    return bool(list_mode_options(mode).get("triton.cudagraphs", False))


def check_compile(c: Any) -> List[str]:
    """Why these compile settings cannot work anywhere, one line each."""
    found = problems(not_one_of("compile.mode", c.mode, COMPILE_MODES),
                     not_one_of("compile.cache", c.cache, COMPILE_CACHES))
    # (judged against a known mode only; an unknown cache does not hide it)
    if c.mode in COMPILE_MODES and c.step_graph and uses_cuda_graphs(c.mode):  # Inductor's own CUDA graphs
        found.append(f"compile.step_graph=true with compile={c.mode} would capture CUDA graphs inside "
                     "CUDA graphs; use compile=default (or off) with compile.step_graph=true")
    return found


def compile_unusable(c: Any, device: "torch.device", caps: Any) -> Optional[str]:
    """Why this machine cannot compile as asked (a skip, not bad input), or None."""
    if device.type == "cpu":
        if uses_cuda_graphs(c.mode):
            return (f"compile={c.mode} means CUDA graphs, which need a CUDA GPU; on the CPU it "
                    "would silently run without them")
        if c.step_graph:
            return "compile.step_graph=true replays CUDA graphs, which need a CUDA GPU"
        if compiles(c) and caps.cxx_compiler is None:
            return f"compile={c.mode} on the CPU needs a C++ compiler (g++/clang++) and none is on PATH"
    elif compiles(c) and not caps.triton:
        return f"compile={c.mode} on a GPU needs triton, which is not importable"
    import torch

    if compiles(c) and not torch._dynamo.is_dynamo_supported():
        return f"compile={c.mode}: torch.compile does not support this Python/platform"
    return None


class CompileOption(Option):
    section, schema = "compile", CompileConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an unknown mode or cache, and compile.step_graph=true with a mode that has CUDA
        graphs of its own (graphs inside graphs). What a captured step cannot replay in other
        sections (fp16 loss scaling, freezing, num_gpus > 1, eager attention uncompiled,
        accumulation=adaptive) is options/rules.py's."""
        return check_compile(cfg.compile)

    def unusable(self, cfg: "RunConfig", device: "torch.device", caps: Any) -> Optional[str]:
        """On the CPU: a mode with CUDA graphs, step graphs, or compiling without a C++ compiler; on
        a GPU, compiling without triton; anywhere, a platform torch.compile does not support."""
        return compile_unusable(cfg.compile, device, caps)

    def from_params(self, params: Any) -> CompileConfig:
        """As every option reads itself back, with mode's YAML 1.1 false read as off."""
        c: CompileConfig = super().from_params(params)
        c.mode = logged_mode(c.mode)
        return c



OPTION = CompileOption()
