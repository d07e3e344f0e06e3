"""The gateway's preflight (components/preflight/gateway.py): its findings and the router's life token, from facts
written by hand as components/remote/preflight_probe.py prints them in its gateway mode."""

from __future__ import annotations

import pytest

from components.config import loader
from components.nodes.node_facts import parse
from components.preflight.findings import Status
from components.preflight.gateway import judge, probe_spec
from fixtures import write_catalog
from harness import ROOT

ROUTER = "spark-vllm-gw-gateway"


@pytest.fixture
def spec(tmp_path):
    config = {"spark-vllm:catalog": str(write_catalog(tmp_path)), "spark-vllm:cluster": "c3",
              "spark-vllm:gatewayKey": "sk-gw", "spark-vllm:gateway": {"models": ["qa"], "port": 4100}}
    return loader.load_gateway("gw", config, {"spark-vllm:gatewayKey"}, ROOT)


def facts(containers=None, port=None, image=True, **raw):
    return parse({"docker": {"server": "27.5.1"}, "image": {"present": image, "id": "sha256:ab"},
                  "running": {"containers": containers or {}},
                  "ports": {"4100": port or {"free": True}}, "seconds": 0.4, **raw})


def by_check(findings):
    return {f.check: (f.status, f.reason, f.fix) for f in findings}


def test_the_probe_asks_for_the_routers_image_without_looking_inside_its_port_and_the_stacks_containers(spec):
    assert probe_spec(spec) == {"gateway": True, "image": "spark-vllm/haproxy:2.6", "inside": False,
                                "ports": [4100], "running": {"stack": "gw"}, "stepTimeout": 15}


def test_a_running_router_keeps_its_token_and_may_hold_its_own_port(spec):
    held = {"free": False, "holders": [{"pid": 7, "process": "haproxy", "container": ROUTER, "stack": "gw"}]}
    found, life = judge(spec, facts({ROUTER: {"running": True, "status": "running", "exitCode": 0,
                                              "life": "20261207T010203Z"}}, held), "NEW")
    assert (life.token, life.dead) == ("20261207T010203Z", None)
    checks = by_check(found)
    assert all(status is Status.OK for status, _, _ in checks.values()), checks
    assert checks["port"][1] == "4100 held by the router" and checks["router"][1] == f"{ROUTER} running"


def test_a_stopped_or_removed_router_gets_a_new_token_and_says_why(spec):
    stopped, life = judge(spec, facts({ROUTER: {"running": False, "status": "exited", "exitCode": 137,
                                                "finishedAgo": 90, "life": "OLD"}}), "NEW")
    assert (life.token, life.dead) == ("NEW", f"{ROUTER} exited 1 min ago (code 137)")
    assert by_check(stopped)["router"][1] == f"{ROUTER} exited 1 min ago (code 137): up recreates it"
    removed, life = judge(spec, facts({}), "NEW")
    assert (life.token, life.dead) == ("NEW", f"{ROUTER} is not on the node")
    assert by_check(removed)["router"][1] == f"{ROUTER} is not on the node: up creates it"


def test_a_port_held_by_another_process_or_a_missing_image_fails_and_names_it(spec):
    held = {"free": False, "holders": [{"pid": 4242, "process": "python3"}]}
    found, _ = judge(spec, facts(port=held, image=False), "NEW")
    checks = by_check(found)
    assert checks["port"] == (Status.FAIL, "4100 is held by python3 (pid 4242), outside any container",
                              "stop it, or set spark-vllm:gateway.port to a free port")
    assert checks["image"][:2] == (Status.FAIL, "the router's image spark-vllm/haproxy:2.6 is not on spark1")
    other = {"free": False, "holders": [{"pid": 9, "process": "vllm", "container": "spark-vllm-qa-ray-head",
                                         "stack": "qa"}]}
    assert by_check(judge(spec, facts(port=other), "NEW")[0])["port"][:2] == (
        Status.FAIL, "4100 is held by vllm (pid 9) in spark-vllm-qa-ray-head of stack qa")


def test_no_ssh_or_no_docker_fails_first(spec):
    found, life = judge(spec, parse({"sshError": "failed: Connection refused"}), "NEW")
    assert [(f.check, f.status) for f in found] == [("ssh", Status.FAIL)] and life.token is None
    found, _ = judge(spec, parse({"docker": {"error": "permission denied"}, "seconds": 0.2}), "NEW")
    assert by_check(found)["docker"] == (Status.FAIL, "permission denied",
                                         "start Docker on spark1, and let nvidia use it")
