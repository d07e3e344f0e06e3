"""Fixtures of the vLLM test double's tests (helpers live in vllm_double_support.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
from vllm_double_support import (RAY_NODE_IP, Double, RayCluster, double_env, ray_skip_reason,
                                 write_model)


@pytest.fixture
def start_double(tmp_path):
    """Factory: start_double(args, **env) -> Double; every double is stopped at teardown."""
    doubles = []

    def start(args, **env):
        double = Double(args, tmp_path / f"double-{len(doubles)}.log", **env)
        doubles.append(double)
        return double

    yield start
    for double in doubles:
        double.stop()


@pytest.fixture
def run_double():
    """run_double(args, timeout, **env) -> CompletedProcess with stdout+stderr in .stdout."""
    def run(args, timeout: float = 60, **env):
        return subprocess.run([sys.executable, "-m", "vllm", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=double_env(**env),
                              timeout=timeout)
    return run


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "lab-tiny")


@pytest.fixture(scope="session")
def bad_arch_model(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "lab-tiny-bad-arch",
                       arch="Qwen3_5ForConditionalGeneration", shards=1)


@pytest.fixture(scope="module")
def ray_cluster_factory(tmp_path_factory):
    """ray_cluster_factory([(node_ip, num_gpus, env), ...]) -> RayCluster, stopped after the module."""
    reason = ray_skip_reason()
    if reason:
        pytest.skip(reason)
    clusters = []

    def start(nodes):
        clusters.append(RayCluster(tmp_path_factory.mktemp("ray"), nodes))
        return clusters[-1]

    yield start
    for cluster in clusters:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_head(ray_cluster_factory):
    """A one-node cluster: the head on RAY_NODE_IP with 2 GPUs."""
    return ray_cluster_factory([(RAY_NODE_IP, 2, None)])
