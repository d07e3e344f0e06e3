"""Two Ray nodes whose raylets carry the head's VLLM_HOST_IP (a copy-pasted environment).

vLLM's own checks catch it once its workers report their IPs. Skipped without `ray`.
"""

import pytest
from vllm_double_support import RAY, ray_env, wait_gpus_free

HEAD_IP, WORKER_IP = "127.0.0.4", "127.0.0.5"


@pytest.fixture(scope="module")
def copy_pasted(ray_cluster_factory):
    return ray_cluster_factory([(HEAD_IP, 1, {"VLLM_HOST_IP": HEAD_IP}),
                                (WORKER_IP, 1, {"VLLM_HOST_IP": HEAD_IP})])


@pytest.fixture
def cluster(copy_pasted):
    wait_gpus_free(copy_pasted)
    return copy_pasted


def test_same_vllm_host_ip_on_two_nodes_fails(cluster, run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--port", "0", "-tp", "2", *RAY], timeout=90,
                        **ray_env(cluster, VLLM_HOST_IP=HEAD_IP))
    assert result.returncode == 1, result.stdout
    assert "Every node should have a unique IP address. Got 2 nodes" in result.stdout
    assert f"1 unique IP addresses {{'{HEAD_IP}'}}" in result.stdout
    assert "Loading safetensors checkpoint shards" not in result.stdout


def test_driver_ip_unknown_to_its_workers_fails(cluster, run_double, tiny_model):
    """The driver says it is the worker node, whose GPU workers report the head's IP."""
    result = run_double(["serve", str(tiny_model), "--port", "0", *RAY], timeout=90,
                        **ray_env(cluster, VLLM_HOST_IP=WORKER_IP))
    assert result.returncode == 1, result.stdout
    assert ("Ray does not allocate any GPUs on the driver node."
            f"Driver IP: {WORKER_IP}, worker IPs: ['{HEAD_IP}'].") in result.stdout
