"""Property: any config, however malformed, either validates and builds, or raises the project's ConfigError."""

from __future__ import annotations

import copy
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.config import loader, spec
from components.resources.fabric_guard import chain_name, guard_command
from components.resources.ray_node import container_env, ray_start
from components.config.schema import ConfigError
from components.resources.vllm_serve import serve_argv, start_script
from fixtures import CLUSTER, MODELS, write_catalog

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["name", "role", "ssh", "host", "port", "via", "fabricIp", "env", "nodes", "ray", "docker", "api", "gpus",
        "shmSizeMb", "ulimits", "memlock", "image", "path", "tensorParallel", "gpuMemoryUtilization",
        "maxModelLen", "enforceEager", "extraArgs", "loadFormat", "fabricInterface", "keyFile", "bind", "user"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["head", "worker", "192.168.200.1", "10.0.0.999",
                                                           "spark1", "auto", "/models/x", "all", "none", "0.8", "yes",
                                                           "no", "8192", "--port", "-tp", "o'neil", "a\nb", "~/x"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)),
    max_leaves=12)
NEW = object()  # in a path: a key the mapping does not have yet


def _paths(data, prefix=()) -> list[tuple]:
    """Every path to a value in `data`, and to a new key of each of its mappings."""
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        found.append((*prefix, NEW))
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += _paths(value, (*prefix, i))
    return found


def mutation(data) -> st.SearchStrategy:
    """A path of `data` (NEW replaced by a drawn key) and a value to put there."""
    return st.tuples(st.sampled_from(_paths(data)), st.sampled_from(KEYS) | st.text(max_size=6), values).map(
        lambda t: (tuple(t[1] if step is NEW else step for step in t[0]), t[2]))


def _mutate(data, path, value) -> bool:
    """Puts `value` at `path` (every step but the last exists: paths come from `_paths`); whether that changed it."""
    target = data
    for step in path[:-1]:
        target = target[step]
    old = target.get(path[-1], NEW) if isinstance(target, dict) else target[path[-1]]
    target[path[-1]] = value
    return old is NEW or old != value or type(old) is not type(value)


def built(d: spec.Deployment) -> None:
    """Everything the program builds from a Deployment, before any resource."""
    chain = chain_name(d.stack, d.cluster)
    for node in d.cluster.nodes:
        container_env(d.cluster, node)
        ray_start(d.cluster, node)
        guard_command(node, "apply", chain, d.cluster.fabric_interface, "label", *d.cluster.guarded_ports)
    serve_argv(d.serve, d.cluster)
    start_script({key: "value" for key in d.secrets})


def test_any_config_validates_and_builds_or_raises_config_error(tmp_path_factory):
    changed: list[tuple[bool, bool]] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cluster_change=mutation(CLUSTER), model_change=mutation(MODELS["big"]),
           stack_key=st.sampled_from([None, "serve", "timeouts", "cluster", "model", "apiKey", "catalog", "bogus"]),
           stack_value=values, secret=st.booleans())
    def check(cluster_change, model_change, stack_key, stack_value, secret):
        cluster, models = copy.deepcopy(CLUSTER), copy.deepcopy(MODELS)
        changed.append((_mutate(cluster, *cluster_change), _mutate(models["big"], *model_change)))
        catalog = write_catalog(tmp_path_factory.mktemp("fuzz"), {"c3": cluster}, models)
        stack = {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3", "spark-vllm:model": "big"}
        if stack_key is not None:
            stack[f"spark-vllm:{stack_key}"] = stack_value
        secrets = {f"spark-vllm:{stack_key}"} if secret else set()
        try:
            d = loader.load("fuzz", stack, secrets, ROOT)
        except ConfigError as e:
            assert "\n" not in str(e) and str(e).endswith(".")
        else:
            built(d)

    check()
    # Each example changes the cluster and the model preset for real, not only when a random path happens to fit.
    assert len(changed) >= 100
    for i in (0, 1):
        assert sum(c[i] for c in changed) >= 0.9 * len(changed)


# Values a user might put anywhere: many fit some key, so a good share of these configs validate and get built.
plausible = st.sampled_from([True, False, "yes", "off", 0, 1, 2, -1, 8192, "8192", 0.5, "0.8", "", "all", "none",
                             "auto", "fastsafetensors", "head", "worker", "spark1", "spark9", "10.10.10.12",
                             "192.168.200.9", "eth1", "/models/y", "/models/y/", "root", "nvidia", "o'neil",
                             "vllm:b", "Vllm:b", ["--trust-remote-code"], ["--port", "1"], ["-tp", 3], {"A": "1"},
                             {"HF_TOKEN": "x"}, {"1": "x"}, "a\nb"])
leaves = [("cluster", path) for path in _paths(CLUSTER) if NEW not in path] + \
         [("model", path) for path in _paths(MODELS["big"]) if NEW not in path]


def test_near_valid_configs_validate_and_build_or_raise_config_error(tmp_path_factory):
    accepted: list[bool] = []

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(leaf=st.sampled_from(leaves), value=plausible)
    def check(leaf, value):
        cluster, models = copy.deepcopy(CLUSTER), copy.deepcopy(MODELS)
        _mutate(cluster if leaf[0] == "cluster" else models["big"], leaf[1], value)
        catalog = write_catalog(tmp_path_factory.mktemp("near"), {"c3": cluster}, models)
        try:
            d = loader.load("near", {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3",
                                     "spark-vllm:model": "big"}, set(), ROOT)
        except ConfigError as e:
            assert "\n" not in str(e) and str(e).endswith(".")
            accepted.append(False)
        else:
            built(d)
            accepted.append(True)

    check()
    # About one in seven validates; a twentieth is far below what chance gives, so the builders surely ran.
    assert sum(accepted) >= 0.05 * len(accepted), f"{sum(accepted)} of {len(accepted)} validated"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_any_catalog_text_validates_or_raises_config_error(tmp_path_factory, text):
    catalog = write_catalog(tmp_path_factory.mktemp("fuzz"))
    (catalog / "clusters.yaml").write_text(text)
    try:
        loader.load("fuzz", {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3",
                             "spark-vllm:model": "big"}, set(), ROOT)
    except ConfigError:
        pass
