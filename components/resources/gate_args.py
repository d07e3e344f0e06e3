"""What each readiness gate checks: the command-line arguments of components/remote/cluster_ready.py (Ray),
rank_ready.py (mp) and serve_ready.py (both)."""

from __future__ import annotations

from typing import Optional

from ..config.spec import ClusterSpec, ServeSpec
from ..config.schema import is_ipv4
from .vllm_serve import ENV_FILE, LOG_FILE, PID_FILE


def cluster_ready_args(cluster: ClusterSpec) -> list[str]:
    """Ray must report exactly the expected nodes, by fabric IP, and GPUs."""
    argv = [f"--address={cluster.head.fabric_ip}:{cluster.ray_port}", f"--gpus={cluster.total_gpus}",
            f"--interface={cluster.fabric_interface}"]
    argv += [f"--expect={n.name}={n.fabric_ip}" for n in cluster.nodes]
    # Management addresses let the gate name the seed's failure: a node registered on the wrong network.
    argv += [f"--management={n.name}={n.ssh_host}" for n in cluster.nodes
             if is_ipv4(n.ssh_host) and n.ssh_host != n.fabric_ip]
    return argv


def rank_ready_args(cluster: ClusterSpec, node_name: str, container: str) -> list[str]:
    """mp: on its node, the rank's container runs and reaches the master, the head's fabric IP."""
    return [f"--node={node_name}", f"--container={container}",
            f"--master={cluster.head.fabric_ip}:{cluster.master_port}", f"--head-node={cluster.head.name}",
            f"--interface={cluster.fabric_interface}"]


def local_url(cluster: ClusterSpec) -> str:
    host = "127.0.0.1" if cluster.api_bind == "0.0.0.0" else cluster.api_bind
    return f"http://{host}:{cluster.api_port}"


def serve_ready_args(cluster: ClusterSpec, serve: ServeSpec, rank0: Optional[str] = None) -> list[str]:
    """/health, then /v1/models listing the model, with the loading progress read from the serve's log.

    With Ray, the serve runs inside the head container (its log, pid and env files); with mp, `rank0` is rank 0's
    container, on the head node, whose own process is the serve (its log is `docker logs`)."""
    argv = [f"--node={cluster.head.name}", f"--url={local_url(cluster)}", f"--model={serve.served_name}",
            f"--model-path={serve.model_path}"]
    if rank0:
        return argv + [f"--container={rank0}"]
    return argv + [f"--log={LOG_FILE}", f"--pid-file={PID_FILE}", f"--env-file={ENV_FILE}"]
