"""Discovery: the cluster entry built from what the nodes showed, and the node script's reading of ibdev2netdev."""

from __future__ import annotations

import importlib.util
import os

from components.nodes.discovery import NodeAddress, SshSettings, cluster_entry
from harness import ROOT

NODES = [NodeAddress("spark1", "10.10.10.11"), NodeAddress("spark2", "192.168.200.2", via="spark1")]


def spark(ip: str, mtu: int = 9000) -> dict:
    """What a DGX Spark shows: both halves of the ConnectX-7 port up, one with the fabric address."""
    return {"fabric": [{"name": "enP2p1s0f1np1", "ipv4": [ip.replace("200", "201") + "/24"], "mtu": mtu},
                       {"name": "enp1s0f1np1", "ipv4": [ip + "/24"], "mtu": mtu}],
            "roce": {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"},
            "gpus": ["NVIDIA GB10"], "docker": {"server": "28.0.1", "runtimes": ["nvidia", "runc"]},
            "limits": {"memlock": -1, "nofile": 1048576, "stack": -1}, "infiniband": True}


def test_two_sparks_make_the_reference_entry():
    entry, problems = cluster_entry(NODES, SshSettings("nvidia", "~/.ssh/id_ed25519"),
                                    {"spark1": spark("192.168.200.1"), "spark2": spark("192.168.200.2")})
    assert problems == []
    assert entry == {
        "ssh": {"user": "nvidia", "keyFile": "~/.ssh/id_ed25519"},
        "fabricInterface": "enp1s0f1np1",
        "docker": {"gpus": "all", "rdma": True},
        "env": {"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"},
        "nodes": [{"name": "spark1", "role": "head", "ssh": {"host": "10.10.10.11"}, "fabricIp": "192.168.200.1"},
                  {"name": "spark2", "ssh": {"host": "192.168.200.2", "via": "spark1"}, "fabricIp": "192.168.200.2"}]}


def test_nodes_without_gpus_runtime_or_rdma_and_low_limits():
    lab = {"fabric": [{"name": "enp1s0f1np1", "ipv4": ["10.87.200.11/24"], "mtu": 9000}], "roce": {},
           "gpus": ["NVIDIA GB10 (lab stand-in)"], "docker": {"server": "20.10.24", "runtimes": ["runc"]},
           "limits": {"memlock": 8388608, "nofile": 20000, "stack": -1}, "infiniband": True}  # a stand-in device
    entry, problems = cluster_entry([NodeAddress("node1", "172.29.87.11")], SshSettings("root"), {"node1": lab},
                                    gpu_probe="echo 'GPU 0: x'")
    assert problems == []
    assert entry["docker"] == {"gpus": "none", "rdma": False, "ulimits": {"memlock": 8388608, "nofile": 20000}}
    assert entry["preflight"] == {"gpuProbe": "echo 'GPU 0: x'"} and "env" not in entry


def test_what_stands_in_the_way_is_named():
    one, two = spark("192.168.200.1", mtu=1500), spark("192.168.200.2")
    two["fabric"] = [c for c in two["fabric"] if c["name"] != "enp1s0f1np1"]
    two["gpus"], two["docker"]["server"] = [], None
    entry, problems = cluster_entry(NODES, SshSettings("nvidia"), {"spark1": one, "spark2": two})
    assert entry["fabricInterface"] == "enP2p1s0f1np1" and "ray" not in entry
    assert problems == ["spark2 shows no GPU", "spark2: Docker does not answer",
                        "spark1's enP2p1s0f1np1 has MTU 1500, not 9000"]
    two["fabric"] = []
    entry, problems = cluster_entry(NODES, SshSettings("nvidia"), {"spark1": one, "spark2": two})
    assert entry["fabricInterface"] == "FILL-IN" and entry["nodes"][1]["fabricIp"] == "FILL-IN"
    assert problems[0] == ("no interface is up with an IPv4 address on every node: spark1 has enP2p1s0f1np1, "
                           "enp1s0f1np1; spark2 has none")


def test_the_node_script_reads_the_up_ports_from_ibdev2netdev(tmp_path, monkeypatch):
    (tmp_path / "ibdev2netdev").write_text("#!/bin/sh\ncat <<'EOF'\n"
                                           "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\n"
                                           "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
                                           "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\nEOF\n")
    (tmp_path / "ibdev2netdev").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    spec = importlib.util.spec_from_file_location("discover_probe", ROOT / "components/remote/discover_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.roce_ports() == {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}
