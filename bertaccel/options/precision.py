"""The `precision` option, in one place: conf/precision/<name>.yaml holds an option's settings,
this module their meaning (autocast, loss scaling), their validation and the machine check.

Adding a precision is one YAML file: `autocast_dtype` (a torch dtype name, or null for none),
`loss_scaling` (GradScaler, for dtypes whose narrow exponent underflows small gradients),
`mfu_peak` (which `peak_tflops_<mfu_peak>` of the hardware profile MFU divides by) and
`fp8_recipe` (torchao's float8 training of the Linear layers, options/fp8.py: tensorwise or rowwise;
null for none).

precision=fp8 runs only where it can pay: a GPU with FP8 tensor cores (sm_89+), torchao installed
(the `fp8` extra) and torch.compile on (rules.py: eagerly, torchao's casts are separate kernels).
With encoder=fused the fused layers' own FP8 GEMMs run instead (encoder/fp8_ops.py: recipe rowwise,
no torchao, compile=off; compile.step_graph=true replays them from CUDA graphs, which they need to pay).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, ContextManager, List, Optional, Tuple, Union

import torch

from bertaccel.config import CONF_DIR, PrecisionConfig
from bertaccel.options.fp8 import FP8_RECIPES
from bertaccel.option import Option

if TYPE_CHECKING:
    from bertaccel.config import RunConfig

OPTIONS_DIR = CONF_DIR / "precision"
# The dtypes autocast can run in, by the names the YAML files use.
AUTOCAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
FP8_MIN_CAPABILITY = (8, 9)  # Ada (sm_89) and Hopper (sm_90) have FP8 tensor cores; Ampere has none
FP8_PIP = "pip install 'bertaccel[fp8]'"


def load_option(name: str) -> Any:
    """The settings of conf/precision/<name>.yaml, typed by the same schema (PrecisionConfig)
    Hydra applies when it composes precision=<name>."""
    from omegaconf import OmegaConf

    path = OPTIONS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in OPTIONS_DIR.glob("*.yaml")))
        raise ValueError(f"precision={name!r}: no conf/precision/{name}.yaml (known: {known})")
    return OmegaConf.merge(OmegaConf.structured(PrecisionConfig), OmegaConf.load(path))


def check_precision(p: Any) -> List[str]:
    """Why these settings cannot work anywhere, one line each, every one at once. A setting that
    needs a certain autocast dtype is judged only against a dtype that is itself valid (one that
    is not is said once, not again as each setting's mismatch); every fp8 recipe, known or not,
    needs bfloat16."""
    found = []
    dtype_valid = True
    if p.autocast_dtype is not None and p.autocast_dtype not in AUTOCAST_DTYPES:
        dtype_valid = False
        found.append(f"precision {p.name}: autocast_dtype={p.autocast_dtype!r} is not one of "
                     f"{', '.join(AUTOCAST_DTYPES)} (or null for no autocast)")
    if dtype_valid and p.loss_scaling and p.autocast_dtype != "float16":
        found.append(f"precision {p.name}: loss_scaling=true needs autocast_dtype float16 (GradScaler "
                     f"guards fp16's 5-bit exponent; {p.autocast_dtype or 'float32'} does not underflow so)")
    if p.fp8_recipe is not None and p.fp8_recipe not in FP8_RECIPES:
        found.append(f"precision {p.name}: fp8_recipe={p.fp8_recipe!r} is not one of {', '.join(FP8_RECIPES)} "
                     "(or null for no FP8)")
    if dtype_valid and p.fp8_recipe is not None and p.autocast_dtype != "bfloat16":
        # torchao's float8 casts its gradients without a loss scale: fp16's GradScaler has no part
        # in it, and what is not FP8 (attention, LayerNorm, the head) runs in bf16 as torchao expects.
        found.append(f"precision {p.name}: fp8_recipe={p.fp8_recipe} needs autocast_dtype bfloat16 (the layers "
                     f"FP8 leaves out run in bf16; {p.autocast_dtype or 'float32'} is not supported)")
    return found


def torchao_missing() -> Optional[str]:
    """Why torchao's float8 training cannot be imported here, or None."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def fp8_unusable(p: Any, device: torch.device, capability: Optional[Tuple[int, int]] = None,
                 torchao: bool = True) -> Optional[str]:
    """Why this machine cannot run FP8 training (a skip), or None. capability: the GPU's (major,
    minor), read from the device when not given; torchao: whether the run needs it (encoder=hf)."""
    if device.type != "cuda":
        return (f"precision={p.name} needs a CUDA GPU with FP8 tensor cores (sm_89 or newer: Ada, Hopper); "
                f"this run is on the {device.type.upper()}")
    major, minor = capability or torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device) if capability is None else "this GPU"
        return (f"precision={p.name} needs FP8 tensor cores (sm_89 or newer: Ada, Hopper); {name} is "
                f"sm_{major}{minor}; use precision=bf16")
    return torchao_unusable(p) if torchao else None


def torchao_unusable(p: Any) -> Optional[str]:
    """Why torchao's float8 training (which fp8 with encoder=hf swaps the Linear layers for) cannot
    run here, or None."""
    why = torchao_missing()
    return f"precision={p.name} needs torchao's float8 training ({why}): {FP8_PIP}" if why else None


def precision_unusable(p: Any, device: torch.device, cpu_native_bf16: bool, torchao: bool = True) -> Optional[str]:
    """Why this machine cannot run the precision (a skip, not bad input), or None. torchao: whether
    fp8 needs torchao (encoder=hf; encoder=fused's FP8 GEMMs are its own)."""
    if p.fp8_recipe is not None:
        return fp8_unusable(p, device, torchao=torchao)
    if device.type == "cpu":
        if p.autocast_dtype == "float16":
            return (f"precision={p.name} needs a CUDA GPU: fp16 autocast with GradScaler targets GPU "
                    "tensor cores, and this run is on the CPU")
        if p.autocast_dtype == "bfloat16" and not cpu_native_bf16:
            return (f"precision={p.name} on a CPU without native bf16 (no avx512_bf16/amx_bf16 flag): "
                    "autocast would emulate it, about 20x slower than fp32 (measured here)")
    elif p.autocast_dtype == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return f"precision={p.name} needs an Ampere or newer GPU; {torch.cuda.get_device_name(device)} has no bf16"
    return None



def scales_rowwise(p: Any) -> bool:
    """precision=fp8_rowwise: each row's own FP8 scale (the recipe encoder=fused's FP8 GEMMs run)."""
    return bool(p.fp8_recipe == "rowwise")

class PrecisionOption(Option):
    section, schema = "precision", PrecisionConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an autocast_dtype autocast cannot run in (AUTOCAST_DTYPES, or null for none), and
        loss_scaling=true with any dtype but float16 (GradScaler guards fp16's narrow exponent only),
        an fp8_recipe torchao has not (tensorwise, rowwise), and fp8 with an autocast dtype but bfloat16."""
        return check_precision(cfg.precision)

    def unusable(self, cfg: "RunConfig", device: torch.device, caps: Any) -> Optional[str]:
        """fp16 on a CPU; bf16 on a CPU without native bf16, or on a GPU before Ampere; fp8 on a CPU,
        or on a GPU before sm_89 (no FP8 tensor cores). fp8 without torchao (the `fp8` extra), which
        only encoder=hf needs, is a rule between the two sections (options/rules.py fp8_torchao)."""
        return precision_unusable(cfg.precision, device, caps.cpu_native_bf16, torchao=False)


OPTION = PrecisionOption()


class Precision:
    """Autocast context and loss scaler of one precision option (its settings, or its name)."""

    def __init__(self, option: Union[str, Any], device: torch.device):
        p = load_option(option) if isinstance(option, str) else option
        self.name = p.name
        self.device_type = device.type
        self.dtype = AUTOCAST_DTYPES[p.autocast_dtype] if p.autocast_dtype is not None else None
        self.scaler = torch.amp.GradScaler(device.type, enabled=bool(p.loss_scaling))
        self.fp8_recipe = p.fp8_recipe

    def prepare(self, model: torch.nn.Module) -> Optional[str]:
        """Makes the model compute in this precision where autocast alone does not (fp8: its Linear
        layers swapped for torchao's Float8Linear, in place, once; with encoder=fused, its layers'
        own FP8 GEMMs switched on instead); says what changed, or None."""
        if self.fp8_recipe is None:
            return None
        from bertaccel.encoder.layer import FusedBertLayer

        fused = [m for m in model.modules() if isinstance(m, FusedBertLayer)]
        if fused:
            switched = [layer for layer in fused if not layer.fp8]
            for layer in switched:
                layer.fp8 = True
            return (f"{len(switched)} fused layers run their GEMMs' forward and two input gradients in FP8 "
                    "(row-wise scales, encoder/fp8_ops.py)") if switched else None
        from bertaccel.options.fp8 import swap_to_fp8

        swapped = swap_to_fp8(model, self.fp8_recipe)
        return f"{len(swapped)} Linear layers swapped for torchao Float8Linear ({self.fp8_recipe})" if swapped else None

    def autocast(self) -> ContextManager[object]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)
