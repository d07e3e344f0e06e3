"""Preflight's probe: one node's facts, gathered by components/remote/preflight_probe.py over the node runner."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

from .. import node_runner
from ..config import Deployment, NodeSpec
from ..fabric_guard import chain_prefix
from ..remote import script
from ..text import last_line

MARK = "SPARK_VLLM_PREFLIGHT "
STEP_TIMEOUT_S = 15  # each command of the probe; the image check starts Python in the image, so it gets more
IMAGE_TIMEOUT_S = 40


def probe_spec(d: Deployment, node: NodeSpec) -> dict:
    cluster = d.cluster
    return {"iface": cluster.fabric_interface, "fabricIp": node.fabric_ip,
            "peers": {n.name: n.fabric_ip for n in cluster.nodes if n.name != node.name},
            "image": d.serve.image, "modelPath": d.serve.model_path,
            "ports": [cluster.ray_port, cluster.dashboard_port, cluster.api_port] if node.head else [],
            "guard": {"script": script("fabric_guard.sh"), "prefix": chain_prefix(d.stack)}
            if cluster.fabric_guard else None,
            "gpuProbe": cluster.gpu_probe, "dockerGpus": cluster.docker_gpus, "hashWeights": d.preflight.hash_weights,
            "syncWeights": d.preflight.sync_weights, "stepTimeout": STEP_TIMEOUT_S, "imageTimeout": IMAGE_TIMEOUT_S}


def probe(d: Deployment, node: NodeSpec) -> dict:
    """One node's facts; {"sshError": why} when SSH fails, {"probeError": why} when the probe cannot run."""
    start = time.monotonic()
    try:
        done = node_runner.run(d.cluster, node, "python3 - " + shlex.quote(json.dumps(probe_spec(d, node))),
                               stdin=script("preflight_probe.py"), timeout=d.preflight.timeout_s)
    except subprocess.TimeoutExpired:
        return {"sshError": f"gave no answer within {d.preflight.timeout_s} s (spark-vllm:preflight.timeoutSeconds)"}
    seconds = round(time.monotonic() - start, 1)
    found = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
    if found:
        return {**json.loads(found[-1]), "seconds": seconds}
    if done.returncode == 255:
        return {"sshError": f"failed: {last_line(done.stderr)}"}
    if done.returncode == 127:
        return {"probeError": "python3 is not installed on the node", "seconds": seconds}
    return {"probeError": f"the probe failed: {last_line(done.stderr)}", "seconds": seconds}
