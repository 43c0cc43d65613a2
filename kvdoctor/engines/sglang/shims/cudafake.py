"""Make CPU torch report CUDA devices (an H200 by default), so SGLang takes its CUDA platform path.

Not SGLang code: only torch.cuda's device queries are answered (availability, count, capability,
name, properties, free memory). No kernel runs; tensors stay on the CPU. `install(n)` reports n
devices (TP runs are one process; SGLang reads the device list, not process groups).
"""
from __future__ import annotations

import types

import torch

H200_BYTES = int(140.4 * (1 << 30))


def install(devices: int = 1, name: str = "NVIDIA H200", capability: tuple[int, int] = (9, 0),
            total_bytes: int = H200_BYTES) -> None:
    cuda = torch.cuda
    props = types.SimpleNamespace(name=name, major=capability[0], minor=capability[1],
                                  total_memory=total_bytes, multi_processor_count=132,
                                  gcnArchName="", uuid="fake", L2_cache_size=50 << 20, warp_size=32)
    torch.version.cuda = "12.9"
    cuda.is_available = lambda: True
    cuda.device_count = lambda: devices
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 0
    cuda.set_device = lambda *a, **k: None
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda: None
    cuda.get_device_capability = lambda device=None: capability
    cuda.get_device_name = lambda device=None: name
    cuda.get_device_properties = lambda device=None: props  # type: ignore[assignment,return-value]  # the fields read
    cuda.mem_get_info = lambda device=None: (total_bytes, total_bytes)
    cuda.memory_allocated = lambda device=None: 0
    cuda.max_memory_allocated = lambda device=None: 0
    cuda.memory_reserved = lambda device=None: 0
    cuda.get_arch_list = lambda: ["sm_90"]
