"""Config validation: every bad input gives one plain sentence naming the file, key path, value and what is accepted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.config import loader
from components.config.schema import ConfigError
from fixtures import cluster_with, models_with, stack_config, write_catalog

ROOT = Path(__file__).resolve().parents[2]


def load(tmp_path, stack=None, clusters=None, models=None, secret_keys=()):
    catalog = write_catalog(tmp_path / "catalog", clusters, models)
    cfg = stack_config(catalog) if stack is None else stack(stack_config(catalog))
    return loader.load("test", cfg, set(secret_keys), ROOT)


def stack_with(**kv):
    return lambda cfg: {**cfg, **{f"spark-vllm:{k}": v for k, v in kv.items()}}


def without(key):
    return lambda cfg: {k: v for k, v in cfg.items() if k != f"spark-vllm:{key}"}


CLUSTERS = "clusters.yaml"
MODELS_FILE = "models.yaml"
STACK = "Pulumi.test.yaml"

# (id, kwargs for load(), file, key path, value as shown, a piece of what is accepted)
BAD = [
    ("unknown stack key", dict(stack=stack_with(modle="big")), STACK, "spark-vllm:modle", "'big'",
     "one of the known keys"),
    ("missing model", dict(stack=without("model")), STACK, "spark-vllm:model", "is missing", "a non-empty string"),
    ("unknown cluster", dict(stack=stack_with(cluster="nope")), STACK, "spark-vllm:cluster", "'nope'",
     "a cluster defined in"),
    ("unknown model preset", dict(stack=stack_with(model="gpt-9")), STACK, "spark-vllm:model", "'gpt-9'",
     "a model defined in"),
    ("malformed fabric IP", dict(clusters=cluster_with(lambda c: c["nodes"][1].update(fabricIp="192.168.200.300"))),
     CLUSTERS, "c3.nodes[1].fabricIp", "'192.168.200.300'", "an IPv4 address"),
    ("fabric IP of wrong type", dict(clusters=cluster_with(lambda c: c["nodes"][0].update(fabricIp=12))),
     CLUSTERS, "c3.nodes[0].fabricIp", "12", "an IPv4 address"),
    ("malformed ssh host", dict(clusters=cluster_with(lambda c: c["nodes"][2]["ssh"].update(host="10.0.0.999"))),
     CLUSTERS, "c3.nodes[2].ssh.host", "'10.0.0.999'", "an IPv4 address or a host name"),
    ("ssh port out of range", dict(clusters=cluster_with(lambda c: c["nodes"][0]["ssh"].update(port=70000))),
     CLUSTERS, "c3.nodes[0].ssh.port", "70000", "a whole number from 1 to 65535"),
    ("ray port zero", dict(clusters=cluster_with(lambda c: c["ray"].update(port=0))),
     CLUSTERS, "c3.ray.port", "0", "from 1 to 65535"),
    ("duplicate fabric IP", dict(clusters=cluster_with(lambda c: c["nodes"][2].update(fabricIp="192.168.200.2"))),
     CLUSTERS, "c3.nodes[2].fabricIp", "is '192.168.200.2', the fabric IP of nodes[1] (spark2) too",
     "a fabric IP used by no other node"),
    ("duplicate node name", dict(clusters=cluster_with(lambda c: c["nodes"][2].update(name="spark2"))),
     CLUSTERS, "c3.nodes[2].name", "is 'spark2', the name of nodes[1] too", "a name used by no other node"),
    ("no head", dict(clusters=cluster_with(lambda c: c["nodes"][0].pop("role"))),
     CLUSTERS, "c3.nodes", "has 0 head nodes", "exactly one node with `role: head`"),
    ("two heads", dict(clusters=cluster_with(lambda c: c["nodes"][2].update(role="head"))),
     CLUSTERS, "c3.nodes", "has 2 head nodes (spark1, spark3)", "exactly one node"),
    ("unknown role", dict(clusters=cluster_with(lambda c: c["nodes"][1].update(role="leader"))),
     CLUSTERS, "c3.nodes[1].role", "'leader'", "one of 'head', 'worker'"),
    ("empty node list", dict(clusters=cluster_with(lambda c: c.update(nodes=[]))),
     CLUSTERS, "c3.nodes", "[]", "a non-empty list of mappings"),
    ("node is not a mapping", dict(clusters=cluster_with(lambda c: c["nodes"].append("spark4"))),
     CLUSTERS, "c3.nodes[3]", "'spark4'", "a mapping of keys to values"),
    ("bad node name", dict(clusters=cluster_with(lambda c: c["nodes"][1].update(name="Spark_2"))),
     CLUSTERS, "c3.nodes[1].name", "'Spark_2'", "lower-case letters, digits and dashes"),
    ("TP x PP differs from the GPUs", dict(stack=stack_with(serve={"tensorParallel": 2})), STACK,
     "spark-vllm:serve.tensorParallel x pipelineParallel", "is 2 x 1 = 2",
     "3 (the GPUs of this stack's nodes in cluster 'c3', spark1, spark2, spark3: 3 x 1), or a `spark-vllm:nodes` list "
     "of 2 of the cluster's nodes"),
    ("TP x PP too many", dict(stack=stack_with(serve={"pipelineParallel": 2})), STACK,
     "spark-vllm:serve.tensorParallel x pipelineParallel", "is 3 x 2 = 6", "3 (the GPUs"),
    ("gpu utilization above 1", dict(stack=stack_with(serve={"gpuMemoryUtilization": 1.2})), STACK,
     "spark-vllm:serve.gpuMemoryUtilization", "1.2", "a number in (0, 1]"),
    ("gpu utilization zero", dict(models=models_with(lambda m: m["big"].update(gpuMemoryUtilization=0))),
     MODELS_FILE, "big.gpuMemoryUtilization", "0", "a number in (0, 1]"),
    ("gpu utilization negative", dict(stack=stack_with(serve={"gpuMemoryUtilization": -0.5})), STACK,
     "spark-vllm:serve.gpuMemoryUtilization", "-0.5", "a number in (0, 1]"),
    ("api key in plain text", dict(stack=stack_with(apiKey="hunter2")), STACK, "spark-vllm:apiKey",
     "is stored in plain text", "pulumi config set --secret spark-vllm:apiKey"),
    ("hf token in plain text", dict(stack=stack_with(hfToken="hf_x")), STACK, "spark-vllm:hfToken",
     "is stored in plain text", "a secret"),
    ("typo in a cluster key", dict(clusters=cluster_with(lambda c: c.update(fabricInterfce="eth1"))),
     CLUSTERS, "c3.fabricInterfce", "is not a known key", "one of the known keys"),
    ("unknown serve override", dict(stack=stack_with(serve={"maxModelLength": 4096})), STACK,
     "spark-vllm:serve.maxModelLength", "is not a known key", "maxModelLen"),
    ("max model len of wrong type", dict(stack=stack_with(serve={"maxModelLen": "long"})), STACK,
     "spark-vllm:serve.maxModelLen", "'long'", "a whole number"),
    ("shm size zero", dict(clusters=cluster_with(lambda c: c["docker"].update(shmSizeMb=0))),
     CLUSTERS, "c3.docker.shmSizeMb", "0", "a whole number from 64"),
    ("shm size negative", dict(clusters=cluster_with(lambda c: c["docker"].update(shmSizeMb=-1))),
     CLUSTERS, "c3.docker.shmSizeMb", "-1", "a whole number from 64"),
    ("gpus per node zero", dict(clusters=cluster_with(lambda c: c["ray"].update(gpusPerNode=0))),
     CLUSTERS, "c3.ray.gpusPerNode", "0", "a whole number from 1 to 16"),
    ("enforce eager not a bool", dict(stack=stack_with(serve={"enforceEager": "sure"})), STACK,
     "spark-vllm:serve.enforceEager", "'sure'", "true or false"),
    ("malformed load format", dict(models=models_with(lambda m: m["big"].update(loadFormat="Fast Safetensors"))),
     MODELS_FILE, "big.loadFormat", "'Fast Safetensors'", "fastsafetensors or instanttensor"),
    ("extra args not a list", dict(stack=stack_with(serve={"extraArgs": "--foo"})), STACK,
     "spark-vllm:serve.extraArgs", "'--foo'", "a list of strings"),
    ("relative model path", dict(models=models_with(lambda m: m["big"].update(path="models/big"))),
     MODELS_FILE, "big.path", "'models/big'", "an absolute path"),
    ("model without image", dict(models=models_with(lambda m: m["big"].pop("image"))),
     MODELS_FILE, "big.image", "is missing", "a Docker image reference"),
    ("jump host names itself", dict(clusters=cluster_with(lambda c: c["nodes"][1]["ssh"].update(via="spark2"))),
     CLUSTERS, "c3.nodes[1].ssh.via", "is 'spark2', the node itself", "a node reached directly"),
    ("jump host unknown", dict(clusters=cluster_with(lambda c: c["nodes"][1]["ssh"].update(via="spark9"))),
     CLUSTERS, "c3.nodes[1].ssh.via", "is 'spark9', which is no node's name",
     "a node reached directly, without ssh.via: spark1, spark3"),
    ("jump through a jumped node", dict(clusters=cluster_with(lambda c: c["nodes"][2]["ssh"].update(via="spark2"))),
     CLUSTERS, "c3.nodes[2].ssh.via", "is 'spark2', which is itself reached via spark1", "reached directly"),
    ("api port clashes with ray", dict(clusters=cluster_with(lambda c: c.update(api={"port": 6379}))),
     CLUSTERS, "c3.api.port", "is 6379, which ray.port also uses", "a port no other Ray or API port uses"),
    ("dashboard port clashes with ray", dict(clusters=cluster_with(lambda c: c["ray"].update(dashboardPort=6379))),
     CLUSTERS, "c3.ray.dashboardPort", "is 6379, which ray.port also uses", "a port no other Ray or API port uses"),
    ("api port clashes with dashboard", dict(clusters=cluster_with(lambda c: c.update(api={"port": 8265}))),
     CLUSTERS, "c3.api.port", "is 8265, which ray.dashboardPort also uses", "a port no other Ray or API port uses"),
    ("api port clashes with a pinned ray port", dict(clusters=cluster_with(lambda c: c.update(api={"port": 6381}))),
     CLUSTERS, "c3.api.port", "is 6381, which ray.dashboardAgentGrpcPort also uses",
     "a port no other Ray or API port uses"),
    ("api port inside the worker ports", dict(clusters=cluster_with(lambda c: c.update(api={"port": 12000}))),
     CLUSTERS, "c3.api.port", "is 12000, inside Ray's worker ports",
     "a port outside Ray's worker ports (10002-19999, ray.minWorkerPort to ray.maxWorkerPort)"),
    ("worker port range upside down", dict(clusters=cluster_with(lambda c: c["ray"].update(
        minWorkerPort=20000, maxWorkerPort=19999))),
     CLUSTERS, "c3.ray.maxWorkerPort", "is 19999", "a port above ray.minWorkerPort (20000)"),
    ("fabric guard not a bool", dict(clusters=cluster_with(lambda c: c["ray"].update(fabricGuard="enabled"))),
     CLUSTERS, "c3.ray.fabricGuard", "is 'enabled'", "true or false"),
    ("dashboard not a bool", dict(clusters=cluster_with(lambda c: c["ray"].update(dashboard="sometimes"))),
     CLUSTERS, "c3.ray.dashboard", "is 'sometimes'", "true or false"),
    ("unknown executor", dict(models=models_with(lambda m: m["big"].update(executor="torchrun"))),
     MODELS_FILE, "big.executor", "'torchrun'", "one of 'ray', 'mp'"),
    ("executor override of wrong case", dict(stack=stack_with(serve={"executor": "MP"})), STACK,
     "spark-vllm:serve.executor", "'MP'", "one of 'ray', 'mp'"),
    ("master port clashes with the api", dict(clusters=cluster_with(lambda c: c.update(mp={"masterPort": 8000}))),
     CLUSTERS, "c3.api.port", "is 8000, which mp.masterPort also uses", "a port no other Ray or API port uses"),
    ("master port inside the worker ports", dict(clusters=cluster_with(lambda c: c.update(mp={"masterPort": 15000}))),
     CLUSTERS, "c3.mp.masterPort", "is 15000, inside Ray's worker ports", "a port outside Ray's worker ports"),
    ("typo under mp", dict(clusters=cluster_with(lambda c: c.update(mp={"port": 29500}))),
     CLUSTERS, "c3.mp.port", "is not a known key", "masterPort"),
    ("extra env overrides pinning", dict(clusters=cluster_with(lambda c: c["env"].update(VLLM_HOST_IP="10.0.0.1"))),
     CLUSTERS, "c3.env.VLLM_HOST_IP", "is '10.0.0.1', which would override a variable spark-vllm pins",
     "pins it to each node's fabric address"),
    ("node env overrides pinning", dict(clusters=cluster_with(lambda c: c["nodes"][1].update(
        env={"NCCL_SOCKET_IFNAME": "enP7s7"}))),
     CLUSTERS, "c3.nodes[1].env.NCCL_SOCKET_IFNAME", "is 'enP7s7', which would override", "pins it"),
    ("env value not a string", dict(clusters=cluster_with(lambda c: c["env"].update(NCCL_IB_DISABLE=0))),
     CLUSTERS, "c3.env.NCCL_IB_DISABLE", "is 0", 'a string (quote numbers and booleans: "0")'),
    ("unknown host key policy", dict(clusters=cluster_with(lambda c: c["ssh"].update(strictHostKeyChecking="maybe"))),
     CLUSTERS, "c3.ssh.strictHostKeyChecking", "'maybe'", "'accept-new'"),
    ("unreadable key file", dict(clusters=cluster_with(lambda c: c["ssh"].update(keyFile="/nonexistent/id"))),
     CLUSTERS, "c3.ssh.keyFile", "cannot be read (No such file or directory)", "a readable SSH private key"),
    ("catalog folder missing", dict(stack=stack_with(catalog="/nonexistent")), STACK, "spark-vllm:catalog",
     "cannot be read", "a folder holding clusters.yaml"),
    ("timeout negative", dict(stack=stack_with(timeouts={"serveReadySeconds": -5})), STACK,
     "spark-vllm:timeouts.serveReadySeconds", "-5", "a whole number from 30"),
    ("drop page cache not a boolean", dict(stack=stack_with(serve={"dropPageCache": "always"})), STACK,
     "spark-vllm:serve.dropPageCache", "'always'", "true or false"),
    ("serve overrides not a mapping", dict(stack=stack_with(serve=["maxModelLen", 4])), STACK,
     "spark-vllm:serve", "['maxModelLen', 4]", "a mapping of keys to values"),
    ("cluster entry not a mapping", dict(clusters={"c3": "spark1,spark2"}), CLUSTERS, "c3",
     "'spark1,spark2'", "a mapping of keys to values"),
]


@pytest.mark.parametrize("kwargs,file,path,shown,accepted", [case[1:] for case in BAD], ids=[c[0] for c in BAD])
def test_bad_config_is_one_plain_sentence(tmp_path, kwargs, file, path, shown, accepted):
    secret_keys = kwargs.pop("secret_keys", ())
    with pytest.raises(ConfigError) as err:
        load(tmp_path, secret_keys=secret_keys, **kwargs)
    message = str(err.value)
    assert message.split(": ", 1)[0].endswith(file), message
    assert f": {path} " in message, message
    assert shown in message, message
    assert f"expected {accepted}" in message or accepted in message.split("; expected ", 1)[1], message
    assert "\n" not in message and "Traceback" not in message


@pytest.mark.parametrize("file,broken", [("clusters.yaml", "c3:\n  nodes: [\n"), ("models.yaml", "big: {image: a\n")])
def test_yaml_syntax_errors_name_file_and_line(tmp_path, file, broken):
    catalog = write_catalog(tmp_path / "catalog")
    (catalog / file).write_text(broken)
    with pytest.raises(ConfigError) as err:
        loader.load("test", stack_config(catalog), set(), ROOT)
    message = str(err.value)
    assert message.startswith(f"{catalog}/{file}: line "), message
    assert "is not valid YAML" in message and "expected valid YAML" in message


def test_secrets_given_as_secrets_are_accepted(tmp_path):
    d = load(tmp_path, stack=stack_with(apiKey="k", hfToken="t"),
             secret_keys=("spark-vllm:apiKey", "spark-vllm:hfToken"))
    assert d.secrets == ("apiKey", "hfToken")


def test_valid_config_resolves_defaults_and_overrides(tmp_path):
    d = load(tmp_path, stack=stack_with(serve={"maxModelLen": 4096, "extraArgs": ["--max-num-batched-tokens", "8192"]}))
    assert d.cluster.head.name == "spark1"
    assert [n.name for n in d.cluster.workers] == ["spark2", "spark3"]
    assert d.cluster.node("spark2").via == "spark1"
    assert d.serve.max_model_len == 4096 and d.serve.tensor_parallel == 3
    assert d.serve.extra_args == ("--max-num-batched-tokens", "8192")
    assert d.serve.served_name == "big" and d.serve.load_format == "auto"
    assert d.serve.drop_page_cache is False and d.preflight.sync_weights is False
    assert load(tmp_path, stack=stack_with(serve={"dropPageCache": True})).serve.drop_page_cache is True
    assert d.cluster.endpoint_host == "10.10.10.11"
    assert d.ssh_private_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert d.serve_ready_timeout_s >= 30 * 60


@pytest.mark.parametrize("stack", ["spark", "gpt-oss", "qwen3-30b", "lab", "lab3", "lab-n1", "lab-n2"])
def test_shipped_stacks_validate(stack, monkeypatch, tmp_path):
    import yaml

    # Shipped clusters name key files under ~; give them one so only the config itself is judged.
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in ("~/.ssh/id_ed25519", "~/.cache/spark-vllm/lab/id_ed25519"):
        path = Path(os.path.expanduser(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("key")
    values = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    d = loader.load(stack, values, set(), ROOT)
    assert d.serve.tensor_parallel * d.serve.pipeline_parallel == d.cluster.total_gpus


def test_executor_defaults_to_ray_and_the_preset_or_stack_picks_mp(tmp_path):
    d = load(tmp_path)
    assert (d.serve.executor, d.cluster.executor, d.cluster.master_port) == ("ray", "ray", 29501)
    d = load(tmp_path / "preset", models=models_with(lambda m: m["big"].update(executor="mp")))
    assert (d.serve.executor, d.cluster.executor) == ("mp", "mp")
    d = load(tmp_path / "stack", stack=stack_with(serve={"executor": "mp"}),
             clusters=cluster_with(lambda c: c.update(mp={"masterPort": 29600})))
    assert (d.serve.executor, d.cluster.master_port) == ("mp", 29600)


def test_the_guard_covers_what_the_executor_opens(tmp_path):
    ray = load(tmp_path).cluster
    assert "6379" in ray.guarded_ports and "29501" not in ray.guarded_ports
    mp = load(tmp_path / "mp", stack=stack_with(serve={"executor": "mp"})).cluster
    assert mp.guarded_ports == ["29501", "29511", "ephemeral"]  # the master, the watchdog's leader, the ranks'
    off = load(tmp_path / "off", stack=stack_with(serve={"executor": "mp"}, watchdog={"enabled": False})).cluster
    assert off.guarded_ports == ["29501", "ephemeral"] and 29511 not in off.head_ports


def test_the_watchdog_defaults_and_settings(tmp_path):
    w = load(tmp_path).watchdog
    assert (w.enabled, w.interval_s, w.failures, w.max_restarts, w.port, w.load_timeout_s) == (
        True, 30, 3, 3, 29511, 2400)
    w = load(tmp_path / "set", stack=stack_with(watchdog={"intervalSeconds": 5, "failures": 2, "maxRestarts": 1,
                                                          "backoff": {"initialSeconds": 1, "maxSeconds": 4}})).watchdog
    assert (w.interval_s, w.failures, w.max_restarts, w.backoff_initial_s, w.backoff_max_s) == (5, 2, 1, 1, 4)


def test_the_shipped_sparks_stacks_name_their_hub_repo_and_the_seed_pulls_its_image(monkeypatch, tmp_path):
    """A model id and an image tag are enough (docs/artifacts.md): every real preset names its Hub repo."""
    import yaml

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/id_ed25519").write_text("key")
    repos = {}
    for stack in ("spark", "gpt-oss", "qwen3-30b", "qwen3-235b"):
        d = loader.load(stack, yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"], set(), ROOT)
        assert d.serve.hub is not None and d.preflight.sync_weights and d.serve.hub.revision == "main"
        repos[stack] = d.serve.hub.repo
        if stack == "spark":
            assert d.images.pull == "head"
    assert repos == {"spark": "Qwen/Qwen3.5-122B-A10B-FP8", "gpt-oss": "openai/gpt-oss-120b",
                     "qwen3-30b": "Qwen/Qwen3-30B-A3B-FP8", "qwen3-235b": "nvidia/Qwen3-235B-A22B-NVFP4"}


def test_shipped_stacks_pick_their_executors():
    """The seed's stack stays on Ray; the other model stacks run without Ray on a current NGC image."""
    import yaml
    picked = {}
    for stack in ("spark", "gpt-oss", "qwen3-30b", "qwen3-235b", "lab", "lab-mp"):
        values = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
        preset = yaml.safe_load((ROOT / "catalog" / "models.yaml").read_text())[values["spark-vllm:model"]]
        picked[stack] = (preset.get("executor", "ray"), preset["image"])
    assert picked["spark"][0] == "ray" and picked["lab"][0] == "ray"
    for stack in ("gpt-oss", "qwen3-30b", "qwen3-235b"):
        assert picked[stack] == ("mp", "nvcr.io/nvidia/vllm:26.10-py3")
    assert picked["lab-mp"] == ("mp", "spark-vllm-lab/vllm-mp:double1")


def test_a_site_catalog_outside_the_checkout_is_found_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_catalog(tmp_path / "spark-site")
    d = loader.load("test", {**stack_config(tmp_path / "unused"), "spark-vllm:catalog": "~/spark-site"}, set(), ROOT)
    assert d.cluster.name == "c3" and d.serve.model_path == "/models/big"
