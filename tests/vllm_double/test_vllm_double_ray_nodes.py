"""Two Ray nodes with one GPU each on loopback IPs, as spark-vllm runs two Sparks.

Each node's raylet gets its own VLLM_HOST_IP (its workers inherit it, as in the node
containers). Skipped when the test interpreter has no `ray`.
"""

import pytest
from vllm_double_support import RAY, RAY_NODE_IP, http, ray_env, wait_gpus_free

HEAD_IP, WORKER_IP = RAY_NODE_IP, "127.0.0.3"


@pytest.fixture(scope="module")
def two_sparks(ray_cluster_factory):
    return ray_cluster_factory([(HEAD_IP, 1, {"VLLM_HOST_IP": HEAD_IP}),
                                (WORKER_IP, 1, {"VLLM_HOST_IP": WORKER_IP})])


@pytest.fixture
def sparks(two_sparks):
    wait_gpus_free(two_sparks)
    return two_sparks


def test_tp2_spans_both_nodes_with_rank0_on_the_driver(sparks, start_double, tiny_model):
    double = start_double([str(tiny_model), "-tp", "2", *RAY],
                          **ray_env(sparks, VLLM_HOST_IP=HEAD_IP))
    double.wait_ready(timeout=90)
    log = double.log()
    assert f"Ray node IPs: ['{HEAD_IP}', '{WORKER_IP}']" in log
    assert f"Ray workers placed: rank 0 on {HEAD_IP}, rank 1 on {WORKER_IP}" in log
    assert http(double.url + "/v1/models")[0] == 200
    assert double.stop() == 0


def test_driver_bundle_follows_vllm_host_ip(sparks, start_double, tiny_model):
    """VLLM_HOST_IP names the driver node: the first bundle is pinned there (node:<ip>)."""
    double = start_double([str(tiny_model), "-tp", "2", *RAY],
                          **ray_env(sparks, VLLM_HOST_IP=WORKER_IP))
    double.wait_ready(timeout=90)
    assert f"Ray workers placed: rank 0 on {WORKER_IP}, rank 1 on {HEAD_IP}" in double.log()
    assert double.stop() == 0


def test_tp2_pp2_needs_four_gpus(sparks, run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--port", "0", "-tp", "2", "-pp", "2", *RAY],
                        timeout=60, **ray_env(sparks, VLLM_DOUBLE_PG_TIMEOUT_S="3"))
    assert result.returncode == 1
    assert "Cannot provide a placement group requiring 4 GPUs" in result.stdout
    assert f"'{HEAD_IP}': {{" in result.stdout and f"'{WORKER_IP}': {{" in result.stdout
