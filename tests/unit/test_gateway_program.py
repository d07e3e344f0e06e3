"""The gateway stack (docs/gateway.md): its config, and what it registers from the model stacks' outputs.

The model stacks' outputs are written out by hand below, as a model stack exports them (components/stacks/model.py);
the expected routes and LiteLLM config are worked out from them by hand.
"""

from __future__ import annotations

import json

import pytest
import yaml

from components.config import loader
from components.config.schema import ConfigError
from fixtures import write_catalog
from harness import ROOT, plain_strings, run_program

GATEWAY_KEY, API_KEY_A = "sk-gateway-unit-1", "sk-model-a-unit-2"


def gateway_config(catalog, **gateway) -> dict:
    return {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3", "spark-vllm:gatewayKey": GATEWAY_KEY,
            "spark-vllm:gateway": {"models": ["qa", "qb"], **gateway}}


SECRET = ("spark-vllm:gatewayKey",)


def refused(tmp_path, config, secret=SECRET) -> str:
    with pytest.raises(ConfigError) as e:
        loader.load_gateway("gw", config, set(secret), ROOT)
    return str(e.value)


def test_a_gateway_on_a_named_node_in_its_port(tmp_path):
    spec = loader.load_gateway("gw", gateway_config(write_catalog(tmp_path), node="spark3", port=4100), set(SECRET),
                               ROOT)
    assert (spec.node.name, spec.port, spec.models) == ("spark3", 4100, ("qa", "qb"))
    assert spec.endpoint_host == "10.10.10.13" and spec.image == "spark-vllm/litellm:1.108.7"


def test_a_gateway_defaults_to_the_head_and_port_4000(tmp_path):
    spec = loader.load_gateway("gw", gateway_config(write_catalog(tmp_path)), set(SECRET), ROOT)
    assert (spec.node.name, spec.port, spec.ready_timeout_s) == ("spark1", 4000, 300)


def test_the_gateway_key_must_be_a_secret(tmp_path):
    assert refused(tmp_path, gateway_config(write_catalog(tmp_path)), secret=()) == (
        "Pulumi.gw.yaml: spark-vllm:gatewayKey is stored in plain text; expected a secret: run "
        "`pulumi config set --secret spark-vllm:gatewayKey <value>`.")


def test_a_model_stacks_key_in_a_gateway_stack_is_refused(tmp_path):
    config = {**gateway_config(write_catalog(tmp_path)), "spark-vllm:model": "small"}
    assert refused(tmp_path, config) == (
        "Pulumi.gw.yaml: spark-vllm:model ('small') is not a gateway's key; expected only cluster, catalog, gateway "
        "and gatewayKey in a gateway stack (one that sets spark-vllm:gateway).")


def test_an_unknown_node_and_a_stack_named_twice_are_refused(tmp_path):
    catalog = write_catalog(tmp_path)
    assert refused(tmp_path, gateway_config(catalog, node="spark4")) == (
        "Pulumi.gw.yaml: spark-vllm:gateway.node is 'spark4' (did you mean spark3?); expected a node of cluster "
        "'c3': spark1, spark2, spark3.")
    config = gateway_config(catalog)
    config["spark-vllm:gateway"]["models"] = ["qa", "qa"]
    assert refused(tmp_path, config) == (
        "Pulumi.gw.yaml: spark-vllm:gateway.models[1] is 'qa', which models[0] names too; expected each stack once.")


MODEL_A = {"baseUrl": "http://10.10.10.11:8000/v1", "servedModel": "qa-model", "nodes": ["spark1"],
           "fabricIps": {"spark1": "192.168.200.1"}, "ports": {"api.port": 8000, "ray.port": 6379},
           "apiKey": API_KEY_A}
MODEL_B = {"baseUrl": "http://192.168.200.2:8100/v1", "servedModel": "qb-model", "nodes": ["spark2", "spark3"],
           "fabricIps": {"spark2": "192.168.200.2", "spark3": "192.168.200.3"}, "ports": {"api.port": 8100}}


def run_gateway(tmp_path, outputs):
    return run_program(gateway_config(write_catalog(tmp_path)), SECRET, stack="gw",
                       stack_outputs={f"organization/spark-vllm/{name}": o for name, o in outputs.items()})


def env_of(rec) -> dict[str, str]:
    envs = rec.by_name("gateway-container").inputs["envs"]
    assert plain_strings(envs) == []  # the whole environment is a secret: it holds the keys
    return dict(e.split("=", 1) for e in envs["value"])


def test_each_deployed_model_stack_is_a_route_to_its_heads_fabric_ip(tmp_path):
    rec = run_gateway(tmp_path, {"qa": MODEL_A, "qb": MODEL_B})
    assert {r.inputs["name"] for r in rec.resources.values() if r.type == "pulumi:pulumi:StackReference"} == {
        "organization/spark-vllm/qa", "organization/spark-vllm/qb"}
    routes = {"qa-model": "http://192.168.200.1:8000/v1", "qb-model": "http://192.168.200.2:8100/v1"}
    assert rec.outputs["routes"] == routes
    labels = {item["label"]: item["value"] for item in rec.by_name("gateway-container").inputs["labels"]}
    assert json.loads(labels["spark-vllm.routes"]) == routes and labels["spark-vllm.stack"] == "gw"
    env = env_of(rec)
    assert yaml.safe_load(env["SVL_GATEWAY_CONFIG"]) == {
        "model_list": [
            {"model_name": "qa-model", "litellm_params": {"model": "hosted_vllm/qa-model",
                                                          "api_base": "http://192.168.200.1:8000/v1",
                                                          "api_key": "os.environ/SVL_ROUTE_KEY_0"}},
            {"model_name": "qb-model", "litellm_params": {"model": "hosted_vllm/qb-model",
                                                          "api_base": "http://192.168.200.2:8100/v1"}}],
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "router_settings": {"num_retries": 0}, "litellm_settings": {"num_retries": 0}}
    assert (env["LITELLM_MASTER_KEY"], env["SVL_ROUTE_KEY_0"], env["SVL_GATEWAY_PORT"]) == (GATEWAY_KEY, API_KEY_A,
                                                                                             "4000")
    assert "SVL_ROUTE_KEY_1" not in env


def test_a_destroyed_model_stack_has_no_route(tmp_path):
    rec = run_gateway(tmp_path, {"qa": {}, "qb": MODEL_B})  # qa destroyed: a stack without outputs
    assert rec.outputs["routes"] == {"qb-model": "http://192.168.200.2:8100/v1"}
    assert [m["model_name"] for m in yaml.safe_load(env_of(rec)["SVL_GATEWAY_CONFIG"])["model_list"]] == ["qb-model"]


def test_no_key_is_in_a_plain_input_or_the_command(tmp_path):
    rec = run_gateway(tmp_path, {"qa": MODEL_A, "qb": MODEL_B})
    for reg in rec.resources.values():
        for text in plain_strings(reg.inputs):
            assert GATEWAY_KEY not in text and API_KEY_A not in text, reg.name
    container = rec.by_name("gateway-container").inputs
    assert container["networkMode"] == "host" and container["restart"] == "unless-stopped"
    assert container["entrypoints"] == ["sh", "-c"] and "$SVL_GATEWAY_CONFIG" in container["command"][0]


def test_the_gate_runs_in_the_router_bounded_and_again_for_each_new_container(tmp_path):
    rec = run_gateway(tmp_path, {"qa": MODEL_A, "qb": MODEL_B})
    gate = rec.by_name("gateway-ready-gate")
    assert gate.inputs["create"] == ("timeout -k 10 390 docker exec -i spark-vllm-gw-gateway python3 - --port=4000 "
                                     "--container=spark-vllm-gw-gateway --timeout=300")
    assert gate.inputs["triggers"] == [rec.by_name("gateway-container").id]
    assert rec.by_name("gateway-container").delete_before_replace


def test_a_model_stack_exports_its_api_key_as_a_secret_for_the_gateway(tmp_path):
    from fixtures import stack_config
    rec = run_program(stack_config(write_catalog(tmp_path), apiKey=API_KEY_A), ("spark-vllm:apiKey",))
    assert rec.outputs["apiKey"] == API_KEY_A
    assert "apiKey" not in run_program(stack_config(write_catalog(tmp_path / "b"))).outputs


def test_the_shipped_lab_gateway_validates_and_runs_the_labs_build_of_the_pinned_router(tmp_path, monkeypatch):
    from labkit.config import GATEWAY_IMAGE, GATEWAY_PACKAGES

    monkeypatch.setenv("HOME", str(tmp_path))  # the lab cluster names its key file under ~
    key = tmp_path / ".cache/spark-vllm/lab/id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("key")
    config = yaml.safe_load((ROOT / "Pulumi.lab-gateway.yaml").read_text())["config"]
    spec = loader.load_gateway("lab-gateway", {**config, "spark-vllm:gatewayKey": GATEWAY_KEY}, set(SECRET), ROOT)
    assert (spec.node.name, spec.port, spec.models, spec.image) == ("node1", 4000, ("lab-n1", "lab-n2"), GATEWAY_IMAGE)
    assert GATEWAY_IMAGE.endswith(":1.108.7") and "litellm[proxy]==1.108.7" in GATEWAY_PACKAGES
    assert spec.endpoint_host == "172.29.87.11"
