"""Preflight's probe: one node's facts, gathered by components/remote/preflight_probe.py over the node runner."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

from .. import node_runner
from ..spec import Deployment, NodeSpec
from ..fabric_guard import chain_prefix
from ..node_facts import NodeFacts, parse
from ..remote import script
from ..text import last_line

MARK = "SPARK_VLLM_PREFLIGHT "
STEP_TIMEOUT_S = 15  # each command of the probe; the image check starts Python in the image, so it gets more
IMAGE_TIMEOUT_S = 40


def probe_spec(deployment: Deployment, node: NodeSpec) -> dict:
    cluster, preflight = deployment.cluster, deployment.preflight
    return {"iface": cluster.fabric_interface, "fabricIp": node.fabric_ip,
            "peers": {n.name: n.fabric_ip for n in cluster.nodes if n.name != node.name},
            "image": deployment.serve.image, "modelPath": deployment.serve.model_path,
            "ports": list(cluster.head_ports) if node.head else [],
            "guard": {"script": script("fabric_guard.sh"), "prefix": chain_prefix(deployment.stack)}
            if cluster.fabric_guard else None,
            "gpuProbe": cluster.gpu_probe, "dockerGpus": cluster.docker_gpus, "hashWeights": preflight.hash_weights,
            "syncWeights": preflight.sync_weights, "stepTimeout": STEP_TIMEOUT_S, "imageTimeout": IMAGE_TIMEOUT_S}


def probe(deployment: Deployment, node: NodeSpec) -> NodeFacts:
    """One node's facts; only `ssh_error` when SSH fails, `probe_error` when the probe cannot run."""
    limit = deployment.preflight.timeout_s
    start = time.monotonic()
    try:
        spec = shlex.quote(json.dumps(probe_spec(deployment, node)))
        cluster = deployment.cluster
        done = node_runner.run(cluster.ssh, node, node_runner.jump_of(cluster, node), f"python3 - {spec}",
                               stdin=script("preflight_probe.py"), timeout=limit)
    except subprocess.TimeoutExpired:
        return NodeFacts(ssh_error=f"gave no answer within {limit} s (spark-vllm:preflight.timeoutSeconds)")
    seconds = round(time.monotonic() - start, 1)
    printed = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
    if printed:
        return parse({**json.loads(printed[-1]), "seconds": seconds})
    if done.returncode == 255:
        return NodeFacts(ssh_error=f"failed: {last_line(done.stderr)}")
    if done.returncode == 127:
        return NodeFacts(probe_error="python3 is not installed on the node", seconds=seconds)
    return NodeFacts(probe_error=f"the probe failed: {last_line(done.stderr)}", seconds=seconds)
