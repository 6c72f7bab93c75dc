"""The machine as bertaccel sees it: Python and the package, the GPUs, torch, Triton, xFormers,
NVML and RAPL. Each check returns its lines (lines.Line) and reuses the code a run asks the same
question with: xFormers' load check is the attention kernel's own (attention/kernels/xformers.py),
NVML's handles and GPM support the collectors' (measure/collectors/), RAPL's packages too."""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch

from bertaccel.doctor.lines import Line
from bertaccel.option import first_line

GPU_TAB = "docs/getting-started.md, GPU tab"


def version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


@dataclass
class Nvml:
    """What NVML says, asked once: the driver and its GPUs, or why NVML cannot be asked."""
    why: Optional[str] = None      # None: NVML answered
    driver: str = ""
    cuda: str = ""                 # the newest CUDA the driver runs, e.g. 13.0
    gpus: List[str] = field(default_factory=list)


def ask_nvml() -> Nvml:
    try:
        import pynvml
    except ImportError:
        return Nvml(why="nvidia-ml-py (pynvml) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return Nvml(why=f"NVML cannot start: {e} (no NVIDIA driver here)")

    def text(s) -> str:  # (older pynvml returns bytes)
        return s.decode() if isinstance(s, bytes) else str(s)

    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        names = [text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                 for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as e:
        return Nvml(why=f"NVML started but did not answer ({e})")
    return Nvml(driver=text(pynvml.nvmlSystemGetDriverVersion()), cuda=f"{cuda // 1000}.{cuda % 1000 // 10}", gpus=names)


def where() -> List[Line]:
    import bertaccel

    return [Line("python", f"{sys.version.split()[0]} at {sys.executable}"),
            Line("bertaccel", f"{version_of('bertaccel')} at {Path(bertaccel.__file__).parent}")]


def gpus(nvml: Nvml) -> List[Line]:
    if torch.cuda.is_available():
        driver = f"driver {nvml.driver}  CUDA {nvml.cuda}" if nvml.why is None else f"driver unknown: {nvml.why}"
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(Line(f"gpu {i}", f"{p.name}  {p.total_memory / 2**30:.1f} GiB  "
                                        f"capability {p.major}.{p.minor}  {driver}"))
        return out
    if nvml.gpus:  # a driver and GPUs, but this torch does not reach them
        fix = (f"this torch is a CPU build: install a CUDA build ({GPU_TAB})" if torch.version.cuda is None else
               f"torch is built for CUDA {torch.version.cuda}, the driver runs CUDA {nvml.cuda} at most: install the "
               f"torch build for your driver ({GPU_TAB}), or check CUDA_VISIBLE_DEVICES")
        return [Line("gpu", f"no CUDA GPU seen by torch, though the driver ({nvml.driver}) has {len(nvml.gpus)}: "
                            f"{', '.join(nvml.gpus)}", fix)]
    return [Line("gpu", "no CUDA GPU (no NVIDIA driver answered): runs train on the CPU; the options that need a GPU "
                        "are skipped (below)", f"on a machine with an NVIDIA GPU and its driver: {GPU_TAB}")]


def torch_line() -> List[Line]:
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build (no CUDA)"
    return [Line("torch", f"{torch.__version__}  {build}  cuda available: {torch.cuda.is_available()}")]


def triton_line() -> List[Line]:
    if importlib.util.find_spec("triton") is None:
        return [Line("triton", "not installed: attention=triton, encoder=fused and the fused optimizers are skipped",
                     "pip install triton (Linux; torch's CUDA builds install the triton they were built with)")]
    version = version_of("triton")
    if not torch.cuda.is_available():
        return [Line("triton", f"{version}  interpreter only (no CUDA GPU): its kernels run only under "
                               "TRITON_INTERPRET=1, for tests")]
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [Line("triton", f"{version}  TRITON_INTERPRET=1 is set: kernels run in the interpreter, slowly",
                     "unset TRITON_INTERPRET (it is for tests)")]
    major, minor = torch.cuda.get_device_capability(0)
    try:
        from bertaccel.doctor.triton_kernel import compile_and_run

        seconds = compile_and_run(torch.device("cuda", 0))
    except Exception as e:  # noqa: BLE001 - a compiler, ptxas or driver failure: the answer
        return [Line("triton", f"{version}  cannot compile for this GPU (sm_{major}{minor}): {first_line(e, limit=300)}",
                     f"reinstall torch from its CUDA index, which brings the triton it was built with ({GPU_TAB})")]
    return [Line("triton", f"{version}  compiles for this GPU (sm_{major}{minor}): a test kernel in {seconds:.1f} s")]


def xformers_line() -> List[Line]:
    from bertaccel.attention.kernels.xformers import XFORMERS_INSTALL, xformers_unusable

    if importlib.util.find_spec("xformers") is None:
        return [Line("xformers", "not installed: attention=xformers is skipped", XFORMERS_INSTALL)]
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    # xFormers prints a warning of several lines to stderr when its extension does not load; the
    # line below says the same, with the fix.
    with contextlib.redirect_stderr(io.StringIO()):
        why = xformers_unusable(device)
    if why is None:
        return [Line("xformers", f"{version_of('xformers')}  loads with torch {torch.__version__}; "
                                 "memory_efficient_attention runs")]
    return [Line("xformers", why, None if "pip install" in why else XFORMERS_INSTALL)]


def nvml_line(nvml: Nvml) -> List[Line]:
    if nvml.why is not None:
        fix = ("pip install nvidia-ml-py" if "not installed" in nvml.why else
               "NVML comes with the NVIDIA driver: on a GPU machine, nvidia-smi must work")
        return [Line("nvml", f"{nvml.why}; GPU energy and activity are not measured", fix)]
    said = f"pynvml {version_of('nvidia-ml-py')}  driver {nvml.driver}  {len(nvml.gpus)} GPU(s)"
    if not torch.cuda.is_available():
        return [Line("nvml", f"{said}; torch sees none, so no run reads them")]
    import pynvml

    from bertaccel.measure.collectors.gpm import gpm_support
    from bertaccel.measure.collectors.nvml import nvml_handles

    handles, why = nvml_handles([torch.device("cuda", 0)])
    if why:
        return [Line("nvml", f"{said}; GPU 0: {why}", "check that the driver and torch see the same GPUs")]
    power_w = pynvml.nvmlDeviceGetPowerUsage(handles[0]) / 1000
    try:
        energy = f"energy counter {pynvml.nvmlDeviceGetTotalEnergyConsumption(handles[0]) / 1e6:.1f} kJ"
    except pynvml.NVMLError as e:  # runs then integrate the power samples (collectors/gpu_energy.py)
        energy = f"no energy counter ({e}): runs integrate the power instead"
    gpm = gpm_support(handles)
    return [Line("nvml", f"{said}; GPU 0: {power_w:.0f} W, {energy}, GPM "
                         f"{'readable' if gpm is None else 'not readable: ' + gpm}")]


def rapl_line() -> List[Line]:
    from bertaccel.measure.collectors.cpu_energy import DEFAULT_ROOT, find_packages

    packages, why = find_packages(DEFAULT_ROOT)
    if why is None:
        return [Line("rapl", f"{len(packages)} CPU package(s) readable ({', '.join(p.name for p in packages)}): "
                             "CPU runs measure their energy")]
    fix = None if "run as root" in why else ("on bare-metal Linux, load the powercap driver: modprobe intel_rapl_common "
                                             "(Intel and AMD Zen); VMs and containers rarely have it")
    return [Line("rapl", f"{why}; CPU runs record energy_kwh as null", fix)]
