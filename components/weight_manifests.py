"""The weights on a node as preflight's probe lists them, compared with another node's: what preflight judges and
what the weights sync (components/weights_sync.py) copies."""

from __future__ import annotations

from .config import ClusterSpec

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def manifest(model: dict) -> dict:
    """What the sync compares: file names and sizes, and SHA-256 sums when preflight took them."""
    if not model.get("exists"):
        return {"exists": False}
    return {"files": model.get("files", []), "sha256": model.get("sha256", {})}


def weight_differences(model: dict, ref_model: dict, hash_weights: bool) -> tuple[list, list, list]:
    """What a node's weights lack against the reference's: (missing, sizes that differ, SHA-256 that differs)."""
    files, theirs = dict(model.get("files", [])), dict(ref_model["files"])
    missing = sorted(set(theirs) - set(files))
    differ = sorted(name for name in set(theirs) & set(files) if theirs[name] != files[name])
    changed = []
    if hash_weights:
        mine, other = model.get("sha256", {}), ref_model.get("sha256", {})
        changed = sorted(name for name in set(mine) & set(other) if mine[name] != other[name] and name not in differ)
    return missing, differ, changed


def sync_needed(cluster: ClusterSpec, hash_weights: bool, facts: dict[str, dict]) -> dict[str, bool]:
    """Worker -> whether its weights are known to differ from the head's (what preflight.syncWeights copies).

    A worker whose weights could not be read is not synced: its row already says `could not check`."""
    head = facts.get(cluster.head.name, {}).get("model", {})
    needed = {}
    for node in cluster.workers:
        model = facts.get(node.name, {}).get("model", {})
        if not head.get("exists") or "unavailable" in model or "exists" not in model:
            needed[node.name] = False
        elif not model["exists"]:
            needed[node.name] = not model.get("isFile")
        else:
            needed[node.name] = any(weight_differences(model, head, hash_weights))
    return needed
