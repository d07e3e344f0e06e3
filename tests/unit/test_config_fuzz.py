"""Property: any config, however malformed, either validates or raises the project's ConfigError."""

from __future__ import annotations

import copy
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components import config
from components.schema import ConfigError
from fixtures import CLUSTER, MODELS, write_catalog

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["name", "role", "ssh", "host", "port", "via", "fabricIp", "env", "nodes", "ray", "docker", "api", "gpus",
        "shmSizeMb", "ulimits", "memlock", "image", "path", "tensorParallel", "gpuMemoryUtilization",
        "maxModelLen", "enforceEager", "extraArgs", "loadFormat", "fabricInterface", "keyFile", "bind"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["head", "worker", "192.168.200.1", "10.0.0.999",
                                                           "spark1", "auto", "/models/x", "all", "none"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)),
    max_leaves=12)


def _mutate(data, path, value):
    """Replaces the value at a path of keys/indexes (stopping where the path no longer fits)."""
    target = data
    for step in path[:-1]:
        if isinstance(target, dict) and step in target:
            target = target[step]
        elif isinstance(target, list) and isinstance(step, int) and 0 <= step < len(target):
            target = target[step]
        else:
            return
    if isinstance(target, dict):
        target[path[-1]] = value
    elif isinstance(target, list) and isinstance(path[-1], int) and 0 <= path[-1] < len(target):
        target[path[-1]] = value


paths = st.lists(st.sampled_from(KEYS) | st.integers(0, 3), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cluster_path=paths, cluster_value=values, model_path=paths, model_value=values,
       stack_key=st.sampled_from(["serve", "timeouts", "cluster", "model", "apiKey", "catalog", "bogus"]),
       stack_value=values, secret=st.booleans())
def test_any_config_validates_or_raises_config_error(tmp_path_factory, cluster_path, cluster_value, model_path,
                                                      model_value, stack_key, stack_value, secret):
    cluster, models = copy.deepcopy(CLUSTER), copy.deepcopy(MODELS)
    _mutate(cluster, cluster_path, cluster_value)
    _mutate(models["big"], model_path, model_value)
    catalog = write_catalog(tmp_path_factory.mktemp("fuzz"), {"c3": cluster}, models)
    stack = {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3", "spark-vllm:model": "big",
             f"spark-vllm:{stack_key}": stack_value}
    secrets = {f"spark-vllm:{stack_key}"} if secret else set()
    try:
        config.load("fuzz", stack, secrets, ROOT)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).endswith(".")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_any_catalog_text_validates_or_raises_config_error(tmp_path_factory, text):
    catalog = write_catalog(tmp_path_factory.mktemp("fuzz"))
    (catalog / "clusters.yaml").write_text(text)
    try:
        config.load("fuzz", {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3",
                             "spark-vllm:model": "big"}, set(), ROOT)
    except ConfigError:
        pass
