"""Preflight's probe: one node's facts, gathered by components/remote/preflight_probe.py over the node runner."""

from __future__ import annotations

import json
import shlex
import subprocess
import time

from ..nodes import node_runner
from ..config.spec import ClusterSpec, Deployment, NodeSpec
from ..resources.fabric_guard import chain_prefix, guard_label
from ..resources.memory_claim import FRACTION_LABEL, STACK_LABEL
from ..resources.mp_rank import container_name as rank_name
from ..nodes.node_facts import NodeFacts, parse
from ..resources.ray_node import container_name as ray_name
from ..remote import script
from ..remote.keeper import STATE
from ..text import last_line
from ..resources.vllm_serve import ENV_FILE, LIFE_FILE, PID_FILE
from ..resources.weights_download import RECORD
from ..resources.watchdog import STATE_DIR, keeper_name

MARK = "SPARK_VLLM_PREFLIGHT "
STEP_TIMEOUT_S = 15  # each command of the probe; the image check starts Python in the image, so it gets more
IMAGE_TIMEOUT_S = 40
API_TIMEOUT_S = 20  # the one completion asked of a running deployment: a healthy engine answers in well under 1 s


def probe_spec(deployment: Deployment, node: NodeSpec) -> dict:
    cluster, preflight = deployment.cluster, deployment.preflight
    return {"iface": cluster.fabric_interface, "fabricIp": node.fabric_ip,
            "peers": {n.name: n.fabric_ip for n in cluster.nodes if n.name != node.name},
            "image": deployment.serve.image, "modelPath": deployment.serve.model_path,
            "ports": list(cluster.head_ports) if node.head else [],
            "guard": {"script": script("fabric_guard.sh"), "prefix": chain_prefix(deployment.stack),
                      "label": guard_label(deployment.stack)}
            if cluster.fabric_guard else None,
            "gpuProbe": cluster.gpu_probe, "dockerGpus": cluster.docker_gpus, "hashWeights": preflight.hash_weights,
            "syncWeights": preflight.sync_weights, "stepTimeout": STEP_TIMEOUT_S, "imageTimeout": IMAGE_TIMEOUT_S,
            "running": running_spec(deployment, node),
            "hubRecord": f"{deployment.serve.model_path}/{RECORD}" if deployment.serve.hub is not None
            and node.name == deployment.source.name else None,
            "claims": {"stack": STACK_LABEL, "fraction": FRACTION_LABEL}}


def running_spec(deployment: Deployment, node: NodeSpec) -> dict:
    """What the probe reads of what runs (liveness.py): the stack's containers; on the head, the serve (Ray), one
    completion, and the keeper's state."""
    spec: dict = {"stack": deployment.stack}
    if not node.head:
        return spec
    cluster, serve = deployment.cluster, deployment.serve
    if serve.executor == "ray":
        spec["serve"] = {"container": ray_name(deployment.stack, node), "ctl": script("serve_ctl.sh"),
                         "pidFile": PID_FILE, "lifeFile": LIFE_FILE, "envFile": ENV_FILE}
    else:
        spec["rank0"] = rank_name(deployment.stack, cluster, node)
    spec["api"] = {"host": cluster.api_host_on_node, "port": cluster.api_port, "model": serve.served_name,
                   "timeout": min(API_TIMEOUT_S, deployment.preflight.timeout_s // 2)}
    if deployment.watchdog.enabled:
        spec.update(keeper=keeper_name(deployment.stack), keeperState=f"{STATE_DIR}/{STATE}")
    return spec


def probe(deployment: Deployment, node: NodeSpec) -> NodeFacts:
    """One node's facts; only `ssh_error` when SSH fails, `probe_error` when the probe cannot run."""
    return probe_node(deployment.cluster, node, probe_spec(deployment, node), deployment.preflight.timeout_s)


def probe_node(cluster: ClusterSpec, node: NodeSpec, spec: dict, limit: int,
               bound: str = "spark-vllm:preflight.timeoutSeconds") -> NodeFacts:
    """The probe's facts of `node` with `spec` (a model stack's, or a gateway's), within `limit` seconds (`bound`
    says what sets it)."""
    start = time.monotonic()
    try:
        argument = shlex.quote(json.dumps(spec))
        done = node_runner.run(cluster.ssh, node, node_runner.jump_of(cluster, node), f"python3 - {argument}",
                               stdin=script("preflight_probe.py"), timeout=limit)
    except subprocess.TimeoutExpired:
        return NodeFacts(ssh_error=f"gave no answer within {limit} s ({bound})")
    seconds = round(time.monotonic() - start, 1)
    printed = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
    if printed:
        return parse({**json.loads(printed[-1]), "seconds": seconds})
    if done.returncode == 255:
        return NodeFacts(ssh_error=f"failed: {last_line(done.stderr)}")
    if done.returncode == 127:
        return NodeFacts(probe_error="python3 is not installed on the node", seconds=seconds)
    return NodeFacts(probe_error=f"the probe failed: {last_line(done.stderr)}", seconds=seconds)
