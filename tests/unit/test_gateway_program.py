"""The gateway stack (docs/gateway.md): its config, and what it registers from the model stacks' outputs.

The model stacks' outputs are written out by hand below, as a model stack exports them (components/stacks/model.py);
the expected routes and the router's config are worked out from them by hand.
"""

from __future__ import annotations

import json

import re

import pytest
import yaml

from components.config import loader
from components.config.schema import ConfigError
from fixtures import write_catalog
from harness import ROOT, plain_strings, run_program

GATEWAY_KEY, API_KEY_A = "sk-gateway-unit-1", "sk-model-a-unit-2"


def gateway_config(catalog, **gateway) -> dict:
    return {"spark-vllm:catalog": str(catalog), "spark-vllm:cluster": "c3", "spark-vllm:gatewayKey": GATEWAY_KEY,
            "spark-vllm:gateway": {"models": ["qa", "qb"], **gateway},
            # Preflight reaches the node over SSH; the mocks have none (test_gateway_preflight.py judges its facts).
            "spark-vllm:preflight": {"enabled": False}}


SECRET = ("spark-vllm:gatewayKey",)


def refused(tmp_path, config, secret=SECRET) -> str:
    with pytest.raises(ConfigError) as e:
        loader.load_gateway("gw", config, set(secret), ROOT)
    return str(e.value)


def test_a_gateway_on_a_named_node_in_its_port(tmp_path):
    spec = loader.load_gateway("gw", gateway_config(write_catalog(tmp_path), node="spark3", port=4100), set(SECRET),
                               ROOT)
    assert (spec.node.name, spec.port, spec.models) == ("spark3", 4100, ("qa", "qb"))
    assert spec.endpoint_host == "10.10.10.13" and spec.image == "spark-vllm/haproxy:2.6"


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
        "Pulumi.gw.yaml: spark-vllm:model ('small') is not a gateway's key; expected only cluster, catalog, gateway, "
        "preflight and gatewayKey in a gateway stack (one that sets spark-vllm:gateway).")


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


def config_of(rec) -> str:
    stdin = rec.by_name("gateway-routes").inputs["stdin"]
    assert plain_strings(stdin) == []  # a secret: it holds the keys
    return stdin["value"]


def unquote(text: str) -> str:
    """A HAProxy double-quoted string's value: its \\xHH escapes read back as UTF-8."""
    assert text[0] == text[-1] == '"' and '"' not in text[1:-1]
    return re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
                  text[1:-1].encode()).decode()


def test_each_deployed_model_stack_is_a_route_to_its_heads_fabric_ip(tmp_path):
    rec = run_gateway(tmp_path, {"qa": MODEL_A, "qb": MODEL_B})
    assert {r.inputs["name"] for r in rec.resources.values() if r.type == "pulumi:pulumi:StackReference"} == {
        "organization/spark-vllm/qa", "organization/spark-vllm/qb"}
    assert rec.outputs["routes"] == {"qa-model": "http://192.168.200.1:8000/v1",
                                     "qb-model": "http://192.168.200.2:8100/v1"}
    config = config_of(rec)
    assert re.findall(r"^    server vllm (\S+) ", config, re.M) == ["192.168.200.1:8000", "192.168.200.2:8100"]
    assert re.findall(r"^    bind (\S+)$", config, re.M) == [":4000"]
    # qa's route sends qa's key; qb's, which has none, sends no key (the gateway's stays with the gateway).
    backends = config.split("\nbackend ")[1:]
    assert [unquote(m) for m in re.findall(r"set-header authorization (\"[^\"]*\")", backends[0])] == [
        f"Bearer {API_KEY_A}"]
    assert "del-header authorization" in backends[1] and "set-header" not in backends[1]
    assert [unquote(m) for m in re.findall(r"acl keyed req.fhdr\(authorization\) -m str (\"[^\"]*\")", config)] == [
        f"Bearer {GATEWAY_KEY}"]
    liveness = re.search(r'string ("[^"]*") if \{ path /health/liveliness \}', config).group(1)
    assert json.loads(unquote(liveness)) == {"status": "alive", "config": rec.outputs["routerConfig"]}


def test_a_destroyed_model_stack_has_no_route(tmp_path):
    rec = run_gateway(tmp_path, {"qa": {}, "qb": MODEL_B})  # qa destroyed: a stack without outputs
    assert rec.outputs["routes"] == {"qb-model": "http://192.168.200.2:8100/v1"}
    assert re.findall(r"^    server vllm (\S+) ", config_of(rec), re.M) == ["192.168.200.2:8100"]


def test_a_key_or_name_cannot_break_out_of_its_string():
    from components.resources.router_config import Backend, render

    key, name = 'k"e y#$HOME\\%n\n\'é', 'qa" } bind :1 #'
    config = render(4000, key, [Backend(name, "10.0.0.1", 8000, "qa", key)]).text
    strings = re.findall(r'"[^"]*"', config)
    for q in strings:
        assert not set(q[1:-1]) & set("\"'$#%"), q
        assert re.sub(r"\\x[0-9a-f]{2}", "", q[1:-1]).count("\\") == 0, q
    assert [unquote(q) for q in re.findall(r"acl keyed req.fhdr\(authorization\) -m str (\"[^\"]*\")", config)] == [
        f"Bearer {key}"]
    # set-header takes a log format, where `%` starts a sample: the key's `%` is doubled.
    assert [unquote(q) for q in re.findall(r"set-header authorization (\"[^\"]*\")", config)] == [
        "Bearer " + key.replace("%", "%%")]
    assert re.findall(r"^\s*bind .*$", config, re.M) == ["    bind :4000"]


def test_no_key_is_in_a_plain_input_or_the_command(tmp_path):
    rec = run_gateway(tmp_path, {"qa": MODEL_A, "qb": MODEL_B})
    for reg in rec.resources.values():
        for text in plain_strings(reg.inputs):
            assert GATEWAY_KEY not in text and API_KEY_A not in text, reg.name
    container = rec.by_name("gateway-container").inputs
    assert container["networkMode"] == "host" and container["restart"] == "unless-stopped"
    assert container["entrypoints"] == ["haproxy"] and container["command"] == ["-W", "-db", "-f", "/cfg/haproxy.cfg"]
    assert container["mounts"] == [{"type": "volume", "source": "spark-vllm-gw-gateway-config", "target": "/cfg",
                                    "readOnly": True}]


def test_a_route_change_rewrites_the_config_and_keeps_the_container(tmp_path):
    """The container's inputs hold nothing of the routes, so a route change cannot replace it; the routes command
    writes the new config (checked by HAProxy) and reloads the running router."""
    one = run_gateway(tmp_path / "1", {"qa": MODEL_A, "qb": MODEL_B})
    two = run_gateway(tmp_path / "2", {"qa": {}, "qb": MODEL_B})
    assert one.by_name("gateway-container").inputs == two.by_name("gateway-container").inputs
    assert config_of(one) != config_of(two)
    routes = one.by_name("gateway-routes").inputs
    assert routes["create"] == two.by_name("gateway-routes").inputs["create"]
    assert routes["create"].startswith("timeout -k 10 120 docker run --rm -i --network none --entrypoint sh -v "
                                       "spark-vllm-gw-gateway-config:/cfg ")
    assert "haproxy -c -q -f /cfg/haproxy.cfg.next && mv /cfg/haproxy.cfg.next /cfg/haproxy.cfg" in routes["create"]
    assert routes["create"].endswith("= true ]; then docker kill -s USR2 spark-vllm-gw-gateway >/dev/null; fi")
    assert one.by_name("gateway-routes").urn in one.by_name("gateway-container").dependencies


def test_the_gate_runs_on_the_node_bounded_with_the_key_on_stdin_and_again_for_each_config(tmp_path):
    one = run_gateway(tmp_path / "1", {"qa": MODEL_A, "qb": MODEL_B})
    two = run_gateway(tmp_path / "2", {"qa": {}, "qb": MODEL_B})
    gate = one.by_name("gateway-ready-gate")
    digest = one.outputs["routerConfig"]
    assert gate.inputs["create"] == ("timeout -k 10 390 python3 - --port=4000 --container=spark-vllm-gw-gateway "
                                     f"--config={digest} --timeout=300")
    assert digest != two.outputs["routerConfig"]  # a new config: the gate runs again
    assert plain_strings(gate.inputs["stdin"]) == [] and f"KEY = {GATEWAY_KEY!r}\n" in gate.inputs["stdin"]["value"]
    assert gate.inputs["triggers"] == [one.by_name("gateway-container").id]
    assert one.by_name("gateway-container").delete_before_replace


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
    assert GATEWAY_IMAGE == "spark-vllm-lab/haproxy:2.6" and GATEWAY_PACKAGES == ["haproxy"]
    assert spec.endpoint_host == "172.29.87.11"
