"""Model directory, config and architecture checks, and shard reading with tqdm-style progress.

The checks run in vLLM's order: locate config.json, resolve the architecture against the
registry, then (after the workers exist) read every *.safetensors shard in full.
"""

import glob
import importlib
import json
import os
import sys
import time

from vllm.logger import init_logger
from vllm.registry import ModelRegistry

logger = init_logger(__name__)

_READ_CHUNK = 16 << 20
_DEFAULT_MAX_MODEL_LEN = 2048  # vLLM's fallback when config.json names no context length


def _hf_hub_cache() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    hf_home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
    return os.path.join(hf_home, "hub")


def _from_hf_cache(model_tag: str):
    """Snapshot dir of a repo id in the offline HF cache, or None (the double never downloads)."""
    if model_tag.count("/") != 1 or model_tag.startswith((".", "/")):
        return None
    repo_dir = os.path.join(_hf_hub_cache(), "models--" + model_tag.replace("/", "--"))
    try:
        with open(os.path.join(repo_dir, "refs", "main")) as ref:
            snapshot = os.path.join(repo_dir, "snapshots", ref.read().strip())
    except OSError:
        return None
    return snapshot if os.path.isdir(snapshot) else None


def resolve_model_dir(model_tag: str) -> str:
    """The directory holding config.json, or vLLM's error naming what was asked for."""
    model_dir = model_tag if os.path.isdir(model_tag) else _from_hf_cache(model_tag)
    if model_dir is None or not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(
            f"Invalid repository ID or local directory specified: '{model_tag}'.\n"
            "Please verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
            "   - For Mistral models: ensure the presence of a 'params.json'.\n"
            f"(vLLM test double: looked for {os.path.join(model_tag, 'config.json')} and in the "
            f"offline Hugging Face cache {_hf_hub_cache()}; it never downloads.)"
        )
    return os.path.abspath(model_dir)


def read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    with open(path) as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None


def resolve_architecture(config: dict) -> str:
    architectures = config.get("architectures") or []
    supported = ModelRegistry.get_supported_archs()
    for arch in architectures:
        if arch in supported:
            logger.info("Resolved architecture: %s", arch)
            return arch
    raise ValueError(
        f"Model architectures {architectures} are not supported for now. "
        f"Supported architectures: dict_keys({supported})"
    )


def resolve_max_model_len(config: dict, requested) -> int:
    derived = config.get("max_position_embeddings")
    if derived is None:
        if requested is None:
            logger.warning("The model's config.json does not contain max_position_embeddings. "
                           "Assuming the model's maximum length is %d.", _DEFAULT_MAX_MODEL_LEN)
        return requested or _DEFAULT_MAX_MODEL_LEN
    if requested is None:
        return int(derived)
    if requested > derived and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise ValueError(
            f"User-specified max_model_len ({requested}) is greater than the derived "
            f"max_model_len (max_position_embeddings={derived} or model_max_length=None in "
            "model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
            "extreme caution."
        )
    return requested


def list_shards(model_dir: str, model_tag: str) -> list:
    shards = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not shards:
        raise RuntimeError(f"Cannot find any model weights with `{model_tag}`")
    return shards


def read_shard(path: str) -> int:
    """Reads one shard to the end (the I/O a real load does); returns its size in bytes."""
    size = 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_READ_CHUNK)
            if not chunk:
                return size
            size += len(chunk)


def _interval(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


# Each load format's bar, as vLLM 0.33 names it (model_executor/model_loader/weight_utils.py; fastsafetensors' bar
# is the package's own), and what one step counts. Other formats show the default loader's bar.
SAFETENSORS_DESC = "Loading safetensors checkpoint shards"
BARS = {"fastsafetensors": ("Loading fastsafetensors checkpoint shards", "files"),
        "instanttensor": ("Loading safetensors using InstantTensor loader", "bytes")}


# The package each load format imports (vLLM's weight_utils.py, behind a PlaceholderModule when it is missing).
LOADER_PACKAGES = {"fastsafetensors": "fastsafetensors", "instanttensor": "instanttensor",
                   "runai_streamer": "runai_model_streamer", "runai_streamer_sharded": "runai_model_streamer",
                   "tensorizer": "tensorizer"}


def _size(n: float, divisor: int) -> str:
    """tqdm's format_sizeof: three significant digits and a k/M/G/… suffix."""
    for unit in ("", "k", "M", "G", "T", "P", "E", "Z"):
        if abs(n) < 999.5:
            if abs(n) < 99.95:
                return f"{n:1.2f}{unit}" if abs(n) < 9.995 else f"{n:2.1f}{unit}"
            return f"{n:3.0f}{unit}"
        n /= divisor
    return f"{n:3.1f}Y"


def progress_line(done: float, total: float, elapsed: float, desc: str = SAFETENSORS_DESC,
                  counts: str = "files") -> str:
    """One line of vLLM's tqdm bar (bar_format "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt}
    [{elapsed}<{remaining}, {rate_fmt}]"); a bar of bytes scales n and total by 1024 and its rate by 1000, as
    tqdm does with unit="B", unit_scale=True, unit_divisor=1024."""
    rate = done / elapsed if done and elapsed > 0 else None
    remaining = "?" if rate is None else _interval((total - done) / rate)
    if counts == "bytes":
        amounts = f"{_size(done, 1024)}/{_size(total, 1024)}"
        rate_text = "?B/s" if rate is None else f"{_size(rate, 1000)}B/s"
    else:
        amounts = f"{done:.0f}/{total:.0f}"
        rate_text = "?it/s" if rate is None else (f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s")
    return (f"{desc}: {100 * done / total:3.0f}% Completed | {amounts} [{_interval(elapsed)}<{remaining}, "
            f"{rate_text}]")


def load_shards(shards: list, delay_s: float, load_format: str = "auto") -> int:
    """Reads all shards, printing one progress line per shard on stderr as tqdm does, in the bar of the load
    format (counted in files or in bytes). A format whose package the image lacks fails as vLLM's placeholder
    module does, with ModuleNotFoundError, once the loader reaches for it."""
    if load_format in LOADER_PACKAGES:
        importlib.import_module(LOADER_PACKAGES[load_format])
    desc, counts = BARS.get(load_format, (SAFETENSORS_DESC, "files"))
    sizes = [os.path.getsize(s) for s in shards]
    total = sum(sizes) if counts == "bytes" else len(shards)
    done, total_bytes = 0, 0
    start = time.perf_counter()
    print(progress_line(0, total, 0.0, desc, counts), file=sys.stderr, flush=True)
    for shard in shards:
        read = read_shard(shard)
        total_bytes += read
        done += read if counts == "bytes" else 1
        time.sleep(delay_s)
        line = progress_line(done, total, time.perf_counter() - start, desc, counts)
        print(line, file=sys.stderr, flush=True)
    print(line, file=sys.stderr, flush=True)  # tqdm prints the final state again on close
    return total_bytes
