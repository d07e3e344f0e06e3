"""The floor of a load, the weights' bytes over the read speed of the disk they are on, and what the last load
achieved against it: the stack's `load` output and scripts/status's row."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from .node_facts import NodeFacts
from .weight_manifests import weight_bytes

TOOK = re.compile(r"Loading weights took ([0-9.]+) seconds")  # vLLM's own line, which the serve gate relays


def node_floor(facts: NodeFacts) -> Optional[float]:
    """Seconds to read this node's weights at its disk's speed; None when either is unknown."""
    weights, disk = weight_bytes(facts.model), facts.disk
    if weights is None or disk is None or disk.unavailable or disk.bytes_per_second <= 0:
        return None
    return weights / disk.bytes_per_second


def floor(facts: Mapping[str, NodeFacts]) -> Optional[float]:
    """The slowest node's floor: every node loads its own copy before any serves. None unless all were measured."""
    floors = [node_floor(f) for f in facts.values()]
    return max(floors) if floors and None not in floors else None  # type: ignore[type-var]


def report(gate_output: str, weights: Optional[int], floor_s: Optional[float]) -> dict[str, Any]:
    """What the last load took, from vLLM's line in the serve gate's output, against the floor: {} before any."""
    took = TOOK.findall(gate_output or "")
    if not took:
        return {}
    seconds = float(took[-1])
    out: dict[str, Any] = {"seconds": seconds}
    if weights is not None and seconds > 0:
        out["gbPerSecond"] = round(weights / seconds / 1e9, 3)
    if floor_s is not None:
        out["floorSeconds"] = round(floor_s, 2)
        out["ratioToFloor"] = round(seconds / floor_s, 1) if floor_s > 0 else None
    return out


def text(load: Mapping[str, Any]) -> str:
    """The `load` output in words, for scripts/status."""
    rate = f", {load['gbPerSecond']:.2f} GB/s" if "gbPerSecond" in load else ""
    if load.get("ratioToFloor") is None:
        return f"{load['seconds']:.1f} s{rate}; its floor was not measured (preflight's disk row says why)"
    return (f"{load['seconds']:.1f} s{rate}: {load['ratioToFloor']:g}x its floor of {load['floorSeconds']:g} s (the "
            "slowest node's weights over its disk's read speed)")
