"""NCCL as torch.distributed loads it: the library vLLM's pip packages put in the image (nvidia/nccl/lib), mapped
into this process for as long as it runs. The double calls nothing in it: a test reads /proc/<pid>/maps to see which
file the serve really mapped (spark-vllm's nccl.hostLibrary mounts the host's over it, docs/host-nccl.md)."""

from __future__ import annotations

import ctypes
import importlib.util
import os
from typing import Optional

from vllm.logger import init_logger

logger = init_logger(__name__)
_loaded: list[ctypes.CDLL] = []  # kept, so that the library stays mapped


def library_path() -> Optional[str]:
    """Where the pip packages' libnccl.so.2 is, as torch finds it; None when the image has none."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except ModuleNotFoundError:
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    return None


def load() -> None:
    """Maps the pip NCCL, asks it its version, and says it as vLLM's pynccl does."""
    path = library_path()
    if path is None:
        return
    library = ctypes.CDLL(path)
    _loaded.append(library)
    code = ctypes.c_int()
    library.ncclGetVersion(ctypes.byref(code))
    major, minor, patch = code.value // 10000, code.value % 10000 // 100, code.value % 100
    logger.info("vLLM is using nccl==%d.%d.%d", major, minor, patch)
