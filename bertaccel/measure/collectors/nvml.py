"""NVML handles for the GPUs a run uses, or the reason there are none."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch


def nvml_handles(devices: Sequence[torch.device]) -> Tuple[List[Any], Optional[str]]:
    """(handles, None) or ([], reason). Handles are matched by UUID, so CUDA_VISIBLE_DEVICES
    reordering cannot make us read another GPU's counters."""
    gpus = [d for d in devices if d.type == "cuda"]
    if not gpus:
        return [], "no GPU: this run is on the CPU"
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()  # reference-counted by NVML; cheap when already initialised
    except pynvml.NVMLError as e:
        return [], f"NVML unavailable: {e}"
    handles = []
    for d in gpus:
        index = d.index if d.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        handle = None
        if uuid is not None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except pynvml.NVMLError:
                handle = None
        if handle is None:  # older torch without uuid: NVML index == CUDA index when unmasked
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        handles.append(handle)
    return handles, None


def nvml_error_name(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
