"""Discovery on the lab: scripts/discover, through node1 as jump host, prints the lab cluster's own entry."""

from __future__ import annotations

import subprocess

import yaml
from conftest import node_sh
from labstack import ROOT

SITE_CHOICES = {"shmSizeMb"}  # chosen by the site, not found on the nodes (the lab's env extras are too)
GPU_PROBE = "echo 'GPU 0: NVIDIA GB10 (lab stand-in)'"


def test_discover_prints_the_lab_clusters_entry_and_changes_nothing(lab2):
    before = [node_sh(n, "ip -br addr; ip route; iptables -S 2>/dev/null; docker ps -aq") for n in (1, 2)]
    done = subprocess.run([str(ROOT / "scripts" / "discover"), "--name", "lab", "--user", "root",
                           "--key", "~/.cache/spark-vllm/lab/id_ed25519",
                           "--known-hosts", "~/.cache/spark-vllm/lab/known_hosts", "--gpu-probe", GPU_PROBE,
                           "node1=172.29.87.11", "node2=10.87.200.12,via=node1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = yaml.safe_load(done.stdout)["lab"]
    expected = yaml.safe_load((ROOT / "catalog" / "clusters.yaml").read_text())["lab"]
    expected.pop("env")
    expected.pop("ray")  # its one key, dashboard: false, is the site's choice for the lab's two cores
    expected["docker"] = {k: v for k, v in expected["docker"].items() if k not in SITE_CHOICES}
    assert found == expected
    assert [node_sh(n, "ip -br addr; ip route; iptables -S 2>/dev/null; docker ps -aq") for n in (1, 2)] == before
