"""Ray side of the double: what vLLM's Ray executor checks and reserves before loading.

Follows vLLM's initialize_ray_cluster / _init_workers_ray: connect to the running cluster,
find the driver node by VLLM_HOST_IP, require a free GPU there, reserve TP*PP {"GPU": 1}
bundles (the first pinned to the driver node with a tiny `node:<ip>` resource), wait for
them with a bound, then start one actor per bundle and check where they landed.
"""

import os
import threading
import time
from contextlib import contextmanager

from vllm.loader import read_shard
from vllm.logger import init_logger

logger = init_logger(__name__)

WORKER_START_TIMEOUT_S = 60
LIVENESS_INTERVAL_S = 5
LIVENESS_TIMEOUT_S = 30


def get_ip() -> str:
    """vLLM's get_ip(): VLLM_HOST_IP if set, else this node's IP as Ray sees it."""
    import ray

    return os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()


class RayWorkerWrapper:
    """One per GPU bundle, named like vLLM's so Ray prefixes its log lines the same way."""

    def __init__(self, rank: int, tensor_parallel_size: int, world_size: int):
        self.rank = rank
        logger.info("rank %d in world size %d is assigned as DP rank 0, PP rank %d, TP rank %d",
                    rank, world_size, rank // tensor_parallel_size, rank % tensor_parallel_size)

    def describe(self):
        import ray

        return get_ip(), ray.get_runtime_context().get_node_id()

    def load_weights(self, shard_paths: list, load_format: str) -> int:
        return sum(read_shard(path, load_format) for path in shard_paths)

    def ping(self) -> int:
        return self.rank


@contextmanager
def _deadline(what: str, seconds: float):
    """Bounds a call that takes no timeout of its own: exit 1 once `seconds` have passed."""
    def expire():
        logger.error("%s did not finish within %g seconds; exiting.", what, seconds)
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise ValueError(f"Failed to import Ray: {err}. "
                         "Please install Ray with `pip install ray`.") from None
    return ray


class RayPlacement:
    """The placement group and workers of one engine; call start() then load()."""

    def __init__(self, tensor_parallel_size: int, pipeline_parallel_size: int,
                 ray_init_timeout_s: float, pg_timeout_s: float):
        self.tp = tensor_parallel_size
        self.world_size = tensor_parallel_size * pipeline_parallel_size
        self.ray_init_timeout_s = ray_init_timeout_s
        self.pg_timeout_s = pg_timeout_s
        self.ray = _import_ray()
        self.placement_group = None
        self.workers = []
        self.worker_ips = []

    def start(self) -> None:
        ray = self.ray
        # ray.init has no timeout of its own and waits long for a GCS that does not answer.
        with _deadline("Connecting to the Ray cluster (ray.init)", self.ray_init_timeout_s):
            ray.init(address="auto")
        self.driver_ip, driver_node_id = self._driver_node()
        self._require_driver_gpu(driver_node_id)
        self._create_placement_group()
        self._start_workers()

    def _alive_nodes(self) -> list:
        return [node for node in self.ray.nodes() if node["Alive"]]

    def _driver_node(self):
        ip = get_ip()
        nodes = self._alive_nodes()
        matches = [node for node in nodes if node["NodeManagerAddress"] == ip]
        node_ips = sorted({node["NodeManagerAddress"] for node in nodes})
        if not matches:
            source = "VLLM_HOST_IP" if os.environ.get("VLLM_HOST_IP") else "The driver's IP (as Ray detected it)"
            raise RuntimeError(
                f"{source} {ip} is not the IP address of any alive Ray node; the Ray node IPs "
                f"are {node_ips}. Make sure the IP addresses used by ray cluster are the same as "
                "VLLM_HOST_IP environment variable specified in each node if you are running on "
                "a multi-node.")
        own_node_id = self.ray.get_runtime_context().get_node_id()
        node = next((n for n in matches if n["NodeID"] == own_node_id), matches[0])
        logger.info("Driver node: %s (node id %s); Ray node IPs: %s", ip, node["NodeID"], node_ips)
        return ip, node["NodeID"]

    def _available_by_ip(self) -> dict:
        from ray._private.state import available_resources_per_node  # what vLLM reads too

        ip_of = {node["NodeID"]: node["NodeManagerAddress"] for node in self._alive_nodes()}
        return {ip_of.get(node_id, node_id): {k: v for k, v in res.items() if k in ("CPU", "GPU")}
                for node_id, res in available_resources_per_node().items()}

    def _require_driver_gpu(self, node_id: str) -> None:
        from ray._private.state import available_resources_per_node

        if self.world_size > self.ray.cluster_resources().get("GPU", 0):
            logger.warning("The number of required GPUs exceeds the total number of available "
                           "GPUs in the placement group.")
        current_node_resource = available_resources_per_node().get(node_id, {})
        if current_node_resource.get("GPU", 0) < 1:
            raise ValueError(
                f"Current node has no GPU available. current_node_resource={current_node_resource}. "
                "vLLM engine cannot start without GPU. Make sure you have at least 1 GPU "
                f"available in a node current_node_id={node_id!r} current_ip={self.driver_ip!r}.")

    def _create_placement_group(self) -> None:
        ray = self.ray
        logger.info("No current placement group found. Creating a new placement group.")
        specs = [{"GPU": 1.0} for _ in range(self.world_size)]
        specs[0][f"node:{self.driver_ip}"] = 0.001  # the driver's own GPU worker
        self.placement_group = ray.util.placement_group(specs, strategy="PACK")
        ready_ref = self.placement_group.ready()
        start = time.time()
        interval = 10.0
        while True:
            remaining = self.pg_timeout_s - (time.time() - start)
            if remaining <= 0:
                break
            ready, _ = ray.wait([ready_ref], timeout=min(interval, remaining))
            if ready:
                return
            interval *= 2
            logger.info(
                "Waiting for creating a placement group of specs for %d seconds. specs=%s. "
                "Check `ray status` and `ray list nodes` to see if you have enough resources, "
                "and make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP "
                "environment variable specified in each node if you are running on a multi-node.",
                int(time.time() - start), specs)
        ray.util.remove_placement_group(self.placement_group)
        self.placement_group = None
        available = self._available_by_ip()
        raise ValueError(
            f"Cannot provide a placement group requiring {self.world_size} GPUs "
            f"(placement_group_specs={specs}) within {self.pg_timeout_s:g} seconds.\n"
            "Tensor parallel size may exceed available GPUs in your cluster. Check resources "
            "with `ray status` and `ray list nodes`.\n"
            f"Available resources per node IP: {available}")

    def _start_workers(self) -> None:
        ray = self.ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # num_cpus=0: a bundle holds only {"GPU": 1}, and Ray adds 1 CPU to actors by default.
        worker_class = ray.remote(num_cpus=0, num_gpus=1)(RayWorkerWrapper)
        self.workers = [
            worker_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=rank,
                placement_group_capture_child_tasks=True,
            )).remote(rank, self.tp, self.world_size)
            for rank in range(self.world_size)
        ]
        try:
            described = ray.get([w.describe.remote() for w in self.workers],
                                timeout=WORKER_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"The {self.world_size} Ray workers did not start within "
                               f"{WORKER_START_TIMEOUT_S} seconds.") from None
        self.worker_ips = [ip for ip, _ in described]
        if self.driver_ip not in self.worker_ips:
            raise ValueError(
                "Ray does not allocate any GPUs on the driver node."
                f"Driver IP: {self.driver_ip}, worker IPs: {self.worker_ips}."
                "Consider adjusting the Ray placement group or running the driver on a GPU node.")
        node_ids = sorted({node_id for _, node_id in described})
        unique_ips = set(self.worker_ips)
        if len(node_ids) != len(unique_ips):
            raise RuntimeError(
                f"Every node should have a unique IP address. Got {len(node_ids)} nodes with node "
                f"ids {node_ids} and {len(unique_ips)} unique IP addresses {unique_ips}. Please "
                "check your network configuration. If you set `VLLM_HOST_IP` environment "
                "variable, make sure it is unique for each node.")
        logger.info("Ray workers placed: %s",
                    ", ".join(f"rank {rank} on {ip}" for rank, ip in enumerate(self.worker_ips)))

    def start_loading(self, shard_paths: list, load_format: str) -> list:
        """Every worker reads the checkpoint on its own node (a node without it fails), as the format reads."""
        return [worker.load_weights.remote(shard_paths, load_format) for worker in self.workers]

    def finish_loading(self, refs: list, timeout_s: float) -> None:
        ray = self.ray
        deadline = time.time() + timeout_s
        for rank, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.time()))
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(f"Ray worker rank {rank} ({self.worker_ips[rank]}) did not finish "
                                   f"loading the checkpoint within {timeout_s:g} seconds.") from None
            except ray.exceptions.RayError as err:
                cause = getattr(err, "cause", None) or err
                raise RuntimeError(f"Ray worker rank {rank} ({self.worker_ips[rank]}) failed to load "
                                   f"the checkpoint: {type(cause).__name__}: {cause}") from None

    def watch(self) -> None:
        """Exit 1 if a worker dies or stops answering, as vLLM's engine dies with its workers."""
        def loop():
            ray = self.ray
            while True:
                time.sleep(LIVENESS_INTERVAL_S)
                try:
                    ray.get([w.ping.remote() for w in self.workers], timeout=LIVENESS_TIMEOUT_S)
                except Exception as err:  # any failure means the engine lost a GPU worker
                    logger.error("Lost a Ray worker of the engine (%s: %s); the engine cannot "
                                 "serve without it. Exiting.", type(err).__name__, err)
                    os._exit(1)

        threading.Thread(target=loop, name="ray-liveness", daemon=True).start()

    def shutdown(self) -> None:
        logger.info("Shutting down Ray distributed executor.")
        self.ray.shutdown()
