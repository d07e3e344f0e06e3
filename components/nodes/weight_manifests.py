"""The weights on a node as preflight's probe lists them, compared with another node's: what preflight judges and
what the weights sync (components/resources/weights_sync.py) copies."""

from __future__ import annotations

from typing import Mapping, Optional

from ..config.spec import ClusterSpec, NodeSpec
from .node_facts import Model, NodeFacts

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_bytes(model: Optional[Model]) -> Optional[int]:
    """The size of the weight files a node has; None when it has no weights folder."""
    if model is None or not model.exists:
        return None
    return sum(size for name, size in model.files if name.endswith(WEIGHT_SUFFIXES))


def manifest(model: Optional[Model]) -> dict:
    """What the sync compares: file names and sizes, and SHA-256 sums when preflight took them."""
    if model is None or not model.exists:
        return {"exists": False}
    return {"files": [list(entry) for entry in model.files], "sha256": dict(model.sha256)}


def weight_differences(model: Model, ref_model: Model, hash_weights: bool) -> tuple[list, list, list]:
    """What a node's weights lack against the reference's: (missing, sizes that differ, SHA-256 that differs)."""
    files, theirs = dict(model.files), dict(ref_model.files)
    missing = sorted(set(theirs) - set(files))
    differ = sorted(name for name in set(theirs) & set(files) if theirs[name] != files[name])
    changed = []
    if hash_weights:
        mine, other = model.sha256, ref_model.sha256
        changed = sorted(name for name in set(mine) & set(other) if mine[name] != other[name] and name not in differ)
    return missing, differ, changed


def sync_needed(cluster: ClusterSpec, source: NodeSpec, hash_weights: bool, facts: Mapping[str, NodeFacts],
                wanted: Optional[Mapping[str, int]] = None) -> dict[str, bool]:
    """Every node but `source` -> whether its weights are known to differ from the source's, or (with `wanted`, the
    files a Hub download fetches, with their sizes) to lack any of those (what preflight.syncWeights copies).

    A node whose weights could not be read is not synced: its row already says `could not check`."""
    ref = facts[source.name].model if source.name in facts else None
    needed = {}
    for node in cluster.nodes:
        if node.name == source.name:
            continue
        model = facts[node.name].model if node.name in facts else None
        if model is None or model.unavailable:
            needed[node.name] = False
        elif wanted is not None:
            have = dict(model.files) if model.exists else {}
            needed[node.name] = any(have.get(path) != n for path, n in wanted.items())
        elif ref is None or not ref.exists:
            needed[node.name] = False
        elif not model.exists:
            needed[node.name] = not model.is_file
        else:
            needed[node.name] = any(weight_differences(model, ref, hash_weights))
    return needed
