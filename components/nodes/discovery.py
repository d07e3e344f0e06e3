"""A cluster catalog entry from what components/remote/discover_probe.py read on each node (scripts/discover).

Pure: the facts in, the entry and the problems out. What a site chooses rather than finds (shmSizeMb, extra env,
the API's bind address and port) is left to the catalog's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..config.validate import DEFAULT_ULIMITS

FABRIC_MTU = 9000  # what the ConnectX-7 link of a Spark is set to


@dataclass(frozen=True)
class NodeAddress:
    """A node as the user names it: how SSH reaches it."""
    name: str
    host: str
    via: Optional[str] = None  # the node to hop through


@dataclass(frozen=True)
class SshSettings:
    user: str
    key_file: Optional[str] = None
    known_hosts_file: Optional[str] = None


def _fabric_interface(nodes: list[NodeAddress], facts: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """The first interface (by name, ignoring case) that every node has as a fabric candidate."""
    shared = set.intersection(*({c["name"] for c in facts[n.name]["fabric"]} for n in nodes))
    return min(shared, key=str.casefold) if shared else None


def cluster_entry(nodes: list[NodeAddress], ssh: SshSettings, facts: Mapping[str, Mapping[str, Any]],
                  gpu_probe: Optional[str] = None) -> tuple[dict, list[str]]:
    """The entry for clusters.yaml (the first node is the head), and what stands in the way of using it."""
    problems: list[str] = []
    iface = _fabric_interface(nodes, facts)
    if iface is None:
        problems.append("no interface is up with an IPv4 address on every node: "
                        + "; ".join(f"{n.name} has {', '.join(c['name'] for c in facts[n.name]['fabric']) or 'none'}"
                                    for n in nodes))
    entry: dict[str, Any] = {"ssh": {"user": ssh.user, **({"keyFile": ssh.key_file} if ssh.key_file else {}),
                                     **({"knownHostsFile": ssh.known_hosts_file} if ssh.known_hosts_file else {})},
                             "fabricInterface": iface or "FILL-IN"}
    runtimes_ok = all("nvidia" in facts[n.name]["docker"]["runtimes"] for n in nodes)
    # RDMA needs an HCA with a port up, not only /dev/infiniband (the lab's nodes have a stand-in device).
    rdma = all(facts[n.name]["infiniband"] and facts[n.name]["roce"] for n in nodes)
    limits = {key: min((facts[n.name]["limits"][key] for n in nodes), key=lambda v: float("inf") if v < 0 else v)
              for key in DEFAULT_ULIMITS}
    lower = {key: value for key, value in limits.items()
             if value >= 0 and (DEFAULT_ULIMITS[key] < 0 or value < DEFAULT_ULIMITS[key])}
    entry["docker"] = {"gpus": "all" if runtimes_ok else "none", "rdma": rdma, **({"ulimits": lower} if lower else {})}
    gpu_counts = {n.name: len(facts[n.name]["gpus"] or []) for n in nodes}
    if min(gpu_counts.values()) > 1:
        entry["ray"] = {"gpusPerNode": min(gpu_counts.values())}
    problems += [f"{name} shows no GPU" for name, count in gpu_counts.items() if count == 0]
    problems += [f"{n.name}: Docker does not answer" for n in nodes if facts[n.name]["docker"]["server"] is None]
    hcas = sorted({hca for n in nodes for hca in facts[n.name]["roce"].values()}, key=str.casefold)
    if hcas:
        entry["env"] = {"NCCL_IB_HCA": ",".join(hcas)}
    if gpu_probe:
        entry["preflight"] = {"gpuProbe": gpu_probe}
    entry["nodes"] = []
    for i, node in enumerate(nodes):
        found = next((c for c in facts[node.name]["fabric"] if c["name"] == iface), None)
        ip = found["ipv4"][0].split("/")[0] if found else "FILL-IN"
        if found and found["mtu"] != FABRIC_MTU:
            problems.append(f"{node.name}'s {iface} has MTU {found['mtu']}, not {FABRIC_MTU}")
        entry["nodes"].append({"name": node.name, **({"role": "head"} if i == 0 else {}),
                               "ssh": {"host": node.host, **({"via": node.via} if node.via else {})},
                               "fabricIp": ip})
    return entry, problems
