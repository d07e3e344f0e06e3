"""Fake checkpoints baked into the node image: valid safetensors files with deterministic bytes.

The vLLM double reads config.json and every shard, like vLLM; the bytes come from SHAKE-256 of the tensor
name, so every build on every machine yields identical files.
"""
import hashlib
import json
import struct
from pathlib import Path

MODELS_DIR = "/models"  # where the node image holds them
MANIFEST = "/etc/svl-lab/models.sha256"  # their files' hashes, written with them, as `lab up` checks them
HIDDEN = 1024           # bf16 [1024, 1024] = 2 MiB a tensor
TENSORS_PER_SHARD = 2   # 4 MiB a shard unless asked for more


def _config(arch: str, layers: int) -> dict:
    return {
        "architectures": [arch],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": HIDDEN // 8,
        "max_position_embeddings": 4096,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }


def _write_shard(path: Path, names: list[str], rows: int) -> None:
    """safetensors layout: u64 LE header length, JSON header (space-padded to 8 bytes), raw tensor data."""
    size = rows * HIDDEN * 2
    header = {"__metadata__": {"format": "pt"}}
    for i, name in enumerate(names):
        header[name] = {"dtype": "BF16", "shape": [rows, HIDDEN], "data_offsets": [i * size, (i + 1) * size]}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in names:
            seed = hashlib.shake_256(name.encode()).digest(HIDDEN * HIDDEN * 2)  # 2 MiB, repeated in larger tensors
            for _ in range(rows // HIDDEN):
                f.write(seed)


def write_model(root: Path, arch: str, shards: int, shard_mib: int = 4) -> None:
    """A checkpoint of `shards` files of `shard_mib` MiB each (a multiple of 4), identical on every build."""
    rows = shard_mib * HIDDEN // 4  # two bf16 tensors of rows x HIDDEN a shard
    root.mkdir(parents=True, exist_ok=True)
    layers = shards * TENSORS_PER_SHARD
    (root / "config.json").write_text(json.dumps(_config(arch, layers), indent=2) + "\n")
    (root / "generation_config.json").write_text(json.dumps({"max_new_tokens": 64}) + "\n")
    weight_map = {}
    for k in range(1, shards + 1):
        shard = f"model-{k:05d}-of-{shards:05d}.safetensors"
        names = [f"model.layers.{(k - 1) * TENSORS_PER_SHARD + j}.mlp.down_proj.weight"
                 for j in range(TENSORS_PER_SHARD)]
        _write_shard(root / shard, names, rows)
        weight_map.update({n: shard for n in names})
    index = {"metadata": {"total_size": len(weight_map) * rows * HIDDEN * 2}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_models(models_dir: Path) -> None:
    write_model(models_dir / "lab-tiny", "Qwen3ForCausalLM", shards=4)
    # An architecture no vLLM registry holds, for the "unsupported model" path.
    write_model(models_dir / "lab-tiny-bad-arch", "LabTinyUnsupportedForCausalLM", shards=1)


def manifest(models_dir: Path) -> dict[str, str]:
    """Each file under models_dir, named as the nodes see it (under MODELS_DIR), to the SHA-256 of its bytes."""
    return {f"{MODELS_DIR}/{f.relative_to(models_dir)}": hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(models_dir.rglob("*")) if f.is_file()}


def parse_manifest(text: str) -> dict[str, str]:
    """sha256sum's output ("<hash>  <path>" a line) as path -> hash."""
    return {path: digest for digest, path in (line.split(None, 1) for line in text.splitlines() if line.strip())}


def format_manifest(files: dict[str, str]) -> str:
    return "".join(f"{digest}  {path}\n" for path, digest in files.items())
