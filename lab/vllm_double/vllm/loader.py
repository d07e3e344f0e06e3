"""Model directory, config and architecture checks, and shard reading with tqdm-style progress.

The checks run in vLLM's order: locate config.json, resolve the architecture against the
registry, then (after the workers exist) read every *.safetensors shard in full.
"""

import glob
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


def progress_line(done: int, total: int, elapsed: float) -> str:
    """One line of vLLM's tqdm bar (bar_format "{desc}: {percentage:3.0f}% Completed | ...")."""
    rate = done / elapsed if done and elapsed > 0 else None
    if rate is None:
        remaining, rate_text = "?", "?it/s"
    else:
        remaining = _interval((total - done) / rate)
        rate_text = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
    return (f"Loading safetensors checkpoint shards: {100 * done / total:3.0f}% Completed | "
            f"{done}/{total} [{_interval(elapsed)}<{remaining}, {rate_text}]")


def load_shards(shards: list, delay_s: float) -> int:
    """Reads all shards, printing one progress line per shard on stderr as tqdm does."""
    total_bytes = 0
    start = time.perf_counter()
    print(progress_line(0, len(shards), 0.0), file=sys.stderr, flush=True)
    for done, shard in enumerate(shards, start=1):
        total_bytes += read_shard(shard)
        time.sleep(delay_s)
        line = progress_line(done, len(shards), time.perf_counter() - start)
        print(line, file=sys.stderr, flush=True)
    print(line, file=sys.stderr, flush=True)  # tqdm prints the final state again on close
    return total_bytes
