"""A model stack's place on its cluster: which of the cluster's nodes it runs on, and which ports it takes.

`spark-vllm:nodes` lists some of the cluster's nodes, in order; the first is the stack's head, whatever the catalog's
`role` says. Left out, the stack runs on every node of the cluster, the catalog's head first.

`spark-vllm:portSlot` lets stacks share a node: slot s moves every fixed port of the cluster (Ray's, mp's master,
the API, the keeper's) up by 100 x s, and gives the stack slice s + 1 of ten of Ray's worker range. Slice 0 is left
to no stack: a default port just below the range (Ray's client server, 10001) moves into it. Left out, the stack
takes the cluster's ports as written and the whole worker range, as before slots existed.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .schema import Section, did_you_mean
from .spec import ClusterSpec
from .validate import PORT_SLOTS, StackKeys, fixed_ports

STRIDE = 100
SLICES = PORT_SLOTS + 1  # the lowest tenth of Ray's worker range is no slot's


def place(cluster: ClusterSpec, keys: StackKeys, keeper_port: Optional[int]) -> tuple[ClusterSpec, Optional[int]]:
    """The cluster as this stack sees it: its nodes only, and its slot's ports, the keeper's (if on) among them."""
    if keys.nodes is not None:
        cluster = _on(cluster, keys.nodes, keys.top)
    if keys.port_slot is None:
        return cluster, keeper_port
    return _in_slot(cluster, keys.port_slot, keys.top, keeper_port)


def _on(cluster: ClusterSpec, names: tuple[str, ...], keys: Section) -> ClusterSpec:
    known = [n.name for n in cluster.nodes]
    for i, name in enumerate(names):
        if name not in known:
            raise keys.error(f"nodes[{i}]", name, f"a node of cluster {cluster.name!r}: {', '.join(known)}",
                             f"is {name!r}" + did_you_mean(name, known))
        if name in names[:i]:
            raise keys.error(f"nodes[{i}]", name, "each node once", f"is {name!r}, which nodes[{names.index(name)}] "
                                                                   "names too")
    nodes = tuple(dataclasses.replace(cluster.node(name), head=i == 0) for i, name in enumerate(names))
    # The API is reached at the stack's head.
    return dataclasses.replace(cluster, nodes=nodes, endpoint_host=cluster.endpoint_of(nodes[0]),
                               jump_hosts=tuple(n for n in cluster.nodes if n.name not in names))


def _in_slot(cluster: ClusterSpec, slot: int, keys: Section,
             keeper_port: Optional[int]) -> tuple[ClusterSpec, Optional[int]]:
    low, high = cluster.worker_ports
    width = (high - low + 1) // SLICES
    if width < STRIDE:
        raise keys.error("portSlot", slot, f"no slot while cluster {cluster.name!r}'s Ray worker range ({low}-{high}) "
                                           f"holds fewer than {SLICES * STRIDE} ports")
    shift = STRIDE * slot
    moved = dataclasses.replace(
        cluster, ray_port=cluster.ray_port + shift, dashboard_port=cluster.dashboard_port + shift,
        ray_ports={flag: port + shift for flag, port in cluster.ray_ports.items()},
        ray_port_env={var: port + shift for var, port in cluster.ray_port_env.items()},
        master_port=cluster.master_port + shift, api_port=cluster.api_port + shift,
        worker_ports=(low + (slot + 1) * width, low + (slot + 2) * width - 1))
    keeper = None if keeper_port is None else keeper_port + shift
    base = {**fixed_ports(cluster), **({keeper_port: "watchdog.port"} if keeper_port else {})}
    shared = (low + width, low + SLICES * width - 1)  # every slot's worker slice
    accepted = (f"a slot where every port of cluster {cluster.name!r} stays below 65536, outside the slots' share "
                f"of Ray's worker ports ({shared[0]}-{shared[1]}) and apart from every other slot's ports")
    for port, key in base.items():
        moved_to = port + shift
        if moved_to > 65535 or shared[0] <= moved_to <= shared[1]:
            where = "above 65535" if moved_to > 65535 else "inside the slots' share of Ray's worker ports"
            raise keys.error("portSlot", slot, accepted, f"is {slot}, which puts {key} at {moved_to}, {where}")
        for other in range(PORT_SLOTS):
            theirs = base.get(moved_to - STRIDE * other)
            if other != slot and theirs:
                raise keys.error("portSlot", slot, accepted,
                                 f"is {slot}, which puts {key} at {moved_to}, where slot {other} puts {theirs}")
    return moved, keeper
