"""A catalog for unit tests: a three-node cluster (one node behind a jump host) and two model presets."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nunit-test-key-material\n-----END OPENSSH PRIVATE KEY-----\n"

CLUSTER = {
    "ssh": {"user": "nvidia", "keyFile": "@KEY@"},
    "fabricInterface": "enp1s0f1np1",
    "ray": {"port": 6379, "dashboardPort": 8265, "gpusPerNode": 1},
    "docker": {"gpus": "all", "rdma": True, "shmSizeMb": 10240},
    "env": {"NCCL_IB_HCA": "rocep1s0f1"},
    "hfCache": "/home/nvidia/.cache/huggingface",
    "nodes": [
        {"name": "spark1", "role": "head", "ssh": {"host": "10.10.10.11"}, "fabricIp": "192.168.200.1"},
        {"name": "spark2", "ssh": {"host": "192.168.200.2", "via": "spark1"}, "fabricIp": "192.168.200.2"},
        {"name": "spark3", "ssh": {"host": "10.10.10.13"}, "fabricIp": "192.168.200.3"},
    ],
}

MODELS = {
    "big": {"image": "vllm:a", "path": "/models/big", "tensorParallel": 3, "maxModelLen": 8192,
            "gpuMemoryUtilization": 0.85, "enforceEager": True},
    "small": {"image": "vllm:a", "path": "/models/small", "tensorParallel": 1},
}


def cluster_with(change) -> dict:
    """The test cluster catalog with `change` applied to a copy of its only cluster."""
    cluster = copy.deepcopy(CLUSTER)
    change(cluster)
    return {"c3": cluster}


def models_with(change) -> dict:
    models = copy.deepcopy(MODELS)
    change(models)
    return models


def write_catalog(folder: Path, clusters: dict | None = None, models: dict | None = None) -> Path:
    """Writes clusters.yaml and models.yaml (with the key file) into `folder` and returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / "id_test"
    key.write_text(KEY)
    clusters = copy.deepcopy(clusters if clusters is not None else {"c3": CLUSTER})
    for cluster in clusters.values():
        ssh = cluster.get("ssh") if isinstance(cluster, dict) else None
        if isinstance(ssh, dict) and ssh.get("keyFile") == "@KEY@":
            ssh["keyFile"] = str(key)
    (folder / "clusters.yaml").write_text(yaml.safe_dump(clusters))
    (folder / "models.yaml").write_text(yaml.safe_dump(models if models is not None else MODELS))
    return folder


def stack_config(catalog: Path, **extra) -> dict:
    # Preflight reaches real nodes over SSH; the mocks have none (tests/unit/test_preflight_checks.py judges its facts).
    config = {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3", "spark-vllm:model": "big",
              "spark-vllm:preflight": {"enabled": False}}
    config.update({f"spark-vllm:{k}": v for k, v in extra.items()})
    return config
