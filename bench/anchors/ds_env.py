"""What the DeepSpeed anchors set up before DeepSpeed builds its JIT ops."""
from __future__ import annotations

import os

import torch


def torch_cuda_arch_for_deepspeed(device: torch.device) -> str | None:
    """DeepSpeed's op builder parses TORCH_CUDA_ARCH_LIST as numbers and fails on an arch
    suffix ("9.0a"); its JIT ops (FusedAdam, CPUAdam) are then built for this device's
    capability instead. Returns "old -> new" when it changed the variable, else None."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if device.type != "cuda" or arch is None or not any(c.isalpha() for c in arch.replace("PTX", "")):
        return None
    cap = torch.cuda.get_device_capability(device)
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cap[0]}.{cap[1]}"
    return f"{arch} -> {os.environ['TORCH_CUDA_ARCH_LIST']}"
