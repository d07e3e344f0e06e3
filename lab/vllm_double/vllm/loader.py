"""Model directory, config and architecture checks, and shard reading with tqdm-style progress.

The checks run in vLLM's order: locate config.json, resolve the architecture against the
registry, then (after the workers exist) read every *.safetensors shard in full.
"""

import glob
import importlib
import json
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from vllm.logger import init_logger
from vllm.registry import ModelRegistry

logger = init_logger(__name__)

_READ_CHUNK = 16 << 20
_ALIGN = 4096  # O_DIRECT offsets: a multiple of the block size
_PARALLEL = 8  # the fast loaders' concurrent reads
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


def read_mapped(path: str) -> int:
    """Reads one shard as the default loader does (safetensors' safe_open memory-maps it): every page faulted in,
    in order, through the page cache. Returns its size in bytes."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return 0
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            for offset in range(0, size, _READ_CHUNK):
                mapped[offset:offset + _READ_CHUNK]  # the copy faults the pages in, as a tensor's would
    return size


def _open_direct(path: str) -> int:
    """The file opened past the page cache (O_DIRECT), as the fast loaders read; buffered where the filesystem
    refuses it (tmpfs)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return os.open(path, os.O_RDONLY)


def read_range(path: str, start: int, end: int) -> int:
    """Reads bytes [start, end) of a file in large aligned transfers past the page cache; returns the count."""
    fd = _open_direct(path)
    buf = mmap.mmap(-1, _READ_CHUNK)  # page-aligned, as O_DIRECT needs
    try:
        done, offset = 0, start - start % _ALIGN
        while offset < end:
            got = os.preadv(fd, [buf], offset)
            if got <= 0:
                break
            done += max(0, min(offset + got, end) - max(offset, start))
            offset += got
        return done
    finally:
        buf.close()
        os.close(fd)


def read_shard(path: str, load_format: str) -> int:
    """One shard read with the load format's pattern (load_shards); returns its size in bytes."""
    if load_format == "fastsafetensors":
        return read_parallel(path, _PARALLEL)
    if load_format == "instanttensor":
        return read_range(path, 0, os.path.getsize(path))
    return read_mapped(path)


def read_parallel(path: str, workers: int) -> int:
    """Reads one whole file in `workers` parallel ranges past the page cache, as fastsafetensors does without GDS
    (one file a rank at a time, read by its threads)."""
    size = os.path.getsize(path)
    step = -(-size // workers // _READ_CHUNK) * _READ_CHUNK or _READ_CHUNK
    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(lambda start: read_range(path, start, min(start + step, size)), range(0, size, step)))


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
    """Reads all shards with the read pattern of the load format, byte for byte, printing a progress line on stderr
    as tqdm does in the format's bar (counted in files or in bytes), one a shard read:
    - the default loader and the others: shard by shard, memory-mapped, through the page cache;
    - fastsafetensors: shard by shard, each in parallel ranges past the page cache;
    - InstantTensor: many shards at once, each past the page cache.
    `delay_s` a shard stands for the copy into GPU memory, which the double has none of. A format whose package the
    image lacks fails as vLLM's placeholder module does, with ModuleNotFoundError, once the loader reaches for it."""
    if load_format in LOADER_PACKAGES:
        importlib.import_module(LOADER_PACKAGES[load_format])
    desc, counts = BARS.get(load_format, (SAFETENSORS_DESC, "files"))
    sizes = [os.path.getsize(s) for s in shards]
    total = sum(sizes) if counts == "bytes" else len(shards)
    start = time.perf_counter()
    line = progress_line(0, total, 0.0, desc, counts)
    print(line, file=sys.stderr, flush=True)

    def read_one(shard: str) -> int:
        read = read_shard(shard, load_format)
        time.sleep(delay_s)
        return read

    done, read_bytes = 0, 0
    with ThreadPoolExecutor(_PARALLEL if load_format == "instanttensor" else 1) as pool:
        for finished in as_completed([pool.submit(read_one, shard) for shard in shards]):
            read = finished.result()
            read_bytes += read
            done += read if counts == "bytes" else 1
            line = progress_line(done, total, time.perf_counter() - start, desc, counts)
            print(line, file=sys.stderr, flush=True)
    print(line, file=sys.stderr, flush=True)  # tqdm prints the final state again on close
    return read_bytes
