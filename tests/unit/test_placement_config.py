"""Placement (`spark-vllm:nodes`, `spark-vllm:portSlot`): a stack on some of its cluster's nodes, in ports of its own.

The expected ports are worked out by hand from the test cluster (tests/unit/fixtures.py): Ray's worker range
10002-19999 is 9998 ports, so a tenth is 999, and slot s takes 10002 + (s + 1) x 999 to 10002 + (s + 2) x 999 - 1.
"""

from __future__ import annotations

import json

import pytest

from components.config import loader
from components.config.schema import ConfigError
from fixtures import cluster_with, stack_config, write_catalog
from harness import ROOT, run_program

STACK = "Pulumi.test.yaml"


def load(tmp_path, clusters=None, **keys):
    return loader.load("test", stack_config(write_catalog(tmp_path / "catalog", clusters), **keys), set(), ROOT)


def refused(tmp_path, clusters=None, **keys) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, clusters, **keys)
    return e.value


def test_without_the_keys_a_stack_runs_on_every_node_in_the_clusters_ports(tmp_path):
    cluster = load(tmp_path).cluster
    assert [(n.name, n.head) for n in cluster.nodes] == [("spark1", True), ("spark2", False), ("spark3", False)]
    assert (cluster.ray_port, cluster.dashboard_port, cluster.api_port, cluster.master_port) == (6379, 8265, 8000,
                                                                                               29501)
    assert cluster.worker_ports == (10002, 19999) and cluster.jump_hosts == ()


def test_the_first_listed_node_is_the_head_and_the_rest_are_jump_hosts_only(tmp_path):
    cluster = load(tmp_path, nodes=["spark3", "spark1"], model="small", serve={"tensorParallel": 2}).cluster
    assert [(n.name, n.head) for n in cluster.nodes] == [("spark3", True), ("spark1", False)]
    assert [n.name for n in cluster.jump_hosts] == ["spark2"]
    assert cluster.endpoint_host == "10.10.10.13"  # spark3's, the stack's head
    assert cluster.node("spark2").via == "spark1"


def test_a_node_behind_a_jump_host_keeps_its_jump_host(tmp_path):
    cluster = load(tmp_path, nodes=["spark2"], model="small").cluster
    assert [n.name for n in cluster.nodes] == ["spark2"] and cluster.head.name == "spark2"
    assert cluster.node(cluster.head.via).ssh_host == "10.10.10.11"


def test_a_slot_moves_every_fixed_port_by_a_hundred_and_takes_its_tenth_of_the_worker_range(tmp_path):
    d = load(tmp_path, portSlot=3)
    c = d.cluster
    assert (c.ray_port, c.dashboard_port, c.api_port, c.master_port, c.watchdog_port, d.watchdog.port) == (
        6679, 8565, 8300, 29801, 29811, 29811)
    assert c.ray_ports == {"runtime-env-agent-port": 6680, "dashboard-agent-grpc-port": 6681,
                           "metrics-export-port": 6682, "dashboard-agent-listen-port": 52665,
                           "ray-client-server-port": 10301}
    assert c.ray_port_env == {"AUTOSCALER_METRIC_PORT": 44517, "DASHBOARD_METRIC_PORT": 44527}
    assert c.worker_ports == (13998, 14996)
    assert load(tmp_path, portSlot=0).cluster.worker_ports == (11001, 11999)


def test_the_world_size_is_the_stacks_nodes_gpus(tmp_path):
    e = refused(tmp_path, model="small")
    assert (e.file, e.path) == (STACK, "spark-vllm:serve.tensorParallel x pipelineParallel")
    assert str(e) == (
        "Pulumi.test.yaml: spark-vllm:serve.tensorParallel x pipelineParallel is 1 x 1 = 1; expected 3 (the GPUs of "
        "this stack's nodes in cluster 'c3', spark1, spark2, spark3: 3 x 1), or a `spark-vllm:nodes` list of 1 of the "
        "cluster's nodes.")
    assert str(refused(tmp_path, nodes=["spark1", "spark2"])) == (
        "Pulumi.test.yaml: spark-vllm:serve.tensorParallel x pipelineParallel is 3 x 1 = 3; expected 2 (the GPUs of "
        "this stack's nodes in cluster 'c3', spark1, spark2: 2 x 1), or a `spark-vllm:nodes` list of 3 of the "
        "cluster's nodes.")
    assert load(tmp_path, model="small", nodes=["spark1"]).serve.tensor_parallel == 1


SMALL_RANGE = cluster_with(lambda c: c["ray"].update(minWorkerPort=10002, maxWorkerPort=11001))

REFUSED = [
    ("an unknown node", dict(nodes=["spark1", "spakr2"], model="small", serve={"tensorParallel": 2}),
     "spark-vllm:nodes[1] is 'spakr2' (did you mean spark2?); expected a node of cluster 'c3': spark1, spark2, spark3"),
    ("a node twice", dict(nodes=["spark1", "spark1"], model="small", serve={"tensorParallel": 2}),
     "spark-vllm:nodes[1] is 'spark1', which nodes[0] names too; expected each node once"),
    ("no node", dict(nodes=[]),
     "spark-vllm:nodes is []; expected a non-empty list of the cluster's node names, the stack's head first"),
    ("a slot past the last", dict(portSlot=9), "spark-vllm:portSlot is 9; expected a whole number from 0 to 8"),
    ("a port past 65535", dict(portSlot=1, clusters=cluster_with(lambda c: c.update(api={"port": 65500}))),
     "spark-vllm:portSlot is 1, which puts api.port at 65600, above 65535; expected a slot where every port of "
     "cluster 'c3' stays below 65536, outside the slots' share of Ray's worker ports (11001-19991) and apart from "
     "every other slot's ports"),
    ("a port moved into the slots' worker ports", dict(portSlot=2, clusters=SMALL_RANGE),
     "spark-vllm:portSlot is 2, which puts ray.clientServerPort at 10201, inside the slots' share of Ray's worker "
     "ports; expected a slot where every port of cluster 'c3' stays below 65536, outside the slots' share of Ray's "
     "worker ports (10102-11001) and apart from every other slot's ports"),
    ("a port another slot takes", dict(portSlot=1, clusters=cluster_with(lambda c: c.update(api={"port": 8165}))),
     "spark-vllm:portSlot is 1, which puts ray.dashboardPort at 8365, where slot 2 puts api.port; expected a slot "
     "where every port of cluster 'c3' stays below 65536, outside the slots' share of Ray's worker ports "
     "(11001-19991) and apart from every other slot's ports"),
    ("a worker range too small to share", dict(portSlot=0, clusters=cluster_with(
        lambda c: c["ray"].update(minWorkerPort=10002, maxWorkerPort=10900))),
     "spark-vllm:portSlot is 0; expected no slot while cluster 'c3''s Ray worker range (10002-10900) holds fewer "
     "than 1000 ports"),
]


@pytest.mark.parametrize("keys, says", [pytest.param(keys, says, id=name) for name, keys, says in REFUSED])
def test_placement_refusals_are_one_sentence(tmp_path, keys, says):
    keys = dict(keys)
    e = refused(tmp_path, keys.pop("clusters", None), **keys)
    assert e.file == STACK and str(e) == f"{STACK}: {says}."


def outputs_and_names(tmp_path, **keys):
    rec = run_program(stack_config(write_catalog(tmp_path / "catalog"), **keys))
    return rec, rec.outputs


def test_a_stack_on_one_node_registers_that_node_alone_reached_through_its_jump_host(tmp_path):
    rec, out = outputs_and_names(tmp_path, model="small", nodes=["spark2"], portSlot=2)
    assert rec.names("pulumi:providers:docker") == {"spark2-docker"}
    assert rec.names("docker:index/container:Container") == {"ray-head-container", "watchdog-keeper-spark2"}
    opts = rec.by_name("spark2-docker").inputs["sshOpts"]
    opts = json.loads(opts) if isinstance(opts, str) else opts
    assert any(o.startswith("ProxyCommand=") and "nvidia@10.10.10.11" in o for o in opts), opts
    command = rec.by_name("ray-head-container").inputs["command"]
    for flag in ("--node-ip-address=192.168.200.2", "--port=6579", "--dashboard-port=8465",
                 "--min-worker-port=12999", "--max-worker-port=13997", "--ray-client-server-port=10201"):
        assert flag in command, (flag, command)
    assert out["nodes"] == ["spark2"]
    assert out["ports"] == {"api.port": 8200, "ray.dashboardPort": 8465, "ray.port": 6579, "watchdog.port": 29711}
    assert out["baseUrl"] == "http://192.168.200.2:8200/v1"
    assert out["fabricIps"] == {"spark2": "192.168.200.2"}


def test_mp_ranks_follow_the_stacks_node_order(tmp_path):
    rec, out = outputs_and_names(tmp_path, model="small", nodes=["spark3", "spark1"],
                                 serve={"tensorParallel": 2, "executor": "mp"}, portSlot=1)
    head = rec.by_name("vllm-rank-spark3-container").inputs["command"]
    worker = rec.by_name("vllm-rank-spark1-container").inputs["command"]
    assert head[head.index("--node-rank") + 1] == "0" and worker[worker.index("--node-rank") + 1] == "1"
    for argv in (head, worker):
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--master-addr") + 1] == "192.168.200.3"
        assert argv[argv.index("--master-port") + 1] == "29601"
    assert head[head.index("--port") + 1] == "8100" and "--headless" in worker
    assert out["ports"] == {"api.port": 8100, "mp.masterPort": 29601, "watchdog.port": 29611}
    assert out["nodes"] == ["spark3", "spark1"]


def test_mp_on_one_node_is_plain_vllm_with_no_rendezvous_to_wait_for(tmp_path):
    rec, _ = outputs_and_names(tmp_path, model="small", nodes=["spark1"], serve={"executor": "mp"})
    rank = rec.by_name("vllm-rank-spark1-container")
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"):
        assert flag not in rank.inputs["command"]
    assert not [name for name in rec.names() if name.startswith("ranks-ready")]
    assert rec.by_name("serve-ready-gate").inputs["triggers"] == [rank.id]


def test_each_node_carries_the_stacks_memory_claim_before_the_serve_starts(tmp_path):
    rec, _ = outputs_and_names(tmp_path, serve={"gpuMemoryUtilization": 0.45})
    first_turn = rec.by_name("vllm-serve-load-turn-spark1")  # the claims, then the load turns, then the serve
    for node in ("spark1", "spark2", "spark3"):
        claim = rec.by_name(f"memory-claim-{node}-volume")
        assert claim.inputs["create"] == (
            "docker volume rm -f spark-vllm-test-memory >/dev/null && docker volume create --label "
            "spark-vllm.stack=test --label spark-vllm.gpu-memory-utilization=0.45 spark-vllm-test-memory >/dev/null")
        assert claim.inputs["delete"] == "docker volume rm -f spark-vllm-test-memory >/dev/null"
        assert claim.delete_before_replace and "*" in claim.replace_on_changes
        assert claim.urn in first_turn.dependencies
    # Each on its own node (the connection is a secret: it holds the key), spark2's through spark1.
    hosts = {node: rec.by_name(f"memory-claim-{node}-volume").inputs["connection"]["value"]["host"]
             for node in ("spark1", "spark2", "spark3")}
    assert hosts == {"spark1": "10.10.10.11", "spark2": "192.168.200.2", "spark3": "10.10.10.13"}


@pytest.mark.parametrize("executor, prefix, first", [("ray", "vllm-serve", "vllm-serve-process"),
                                                     ("mp", "mp-serve", "vllm-rank-spark3-container")])
def test_the_load_turns_are_taken_in_node_name_order_before_vllm_starts(tmp_path, executor, prefix, first):
    """Two stacks sharing two nodes take their turns in the same order, so neither holds one and waits for the
    other's; the turn is taken (bounded), and given back on delete."""
    rec, _ = outputs_and_names(tmp_path, model="small", nodes=["spark3", "spark1"], portSlot=1,
                               serve={"tensorParallel": 2, "executor": executor, "dropPageCache": True})
    one, three = rec.by_name(f"{prefix}-load-turn-spark1"), rec.by_name(f"{prefix}-load-turn-spark3")
    assert one.urn in three.dependencies
    assert {rec.by_name("memory-claim-spark1-volume").urn, rec.by_name("memory-claim-spark3-volume").urn} <= set(
        one.dependencies)
    for turn in (one, three):
        assert turn.urn in rec.by_name(first).dependencies
        # The cache drop frees memory: it waits for the turn too.
        assert turn.urn in rec.by_name(f"{prefix}-drop-cache-spark1").dependencies
    create = three.inputs["create"]
    assert create == ("timeout -k 10 2430 python3 - take --stack=test --node=spark3 "
                      "--health=http://192.168.200.3:8100/health --hold=2400 --wait=2400")
    assert three.inputs["delete"] == (
        "if [ \"$(docker inspect -f '{{index .Config.Labels \"spark-vllm.load-turn-stack\"}}' spark-vllm-load-turn "
        "2>/dev/null)\" = test ]; then docker rm -f spark-vllm-load-turn >/dev/null 2>&1 || true; fi")
    # Replaced, the old turn is given back first: after, it would end the new one (same name, same stack).
    assert three.delete_before_replace


@pytest.mark.parametrize("executor, prefix", [("ray", "vllm-serve"), ("mp", "mp-serve")])
def test_with_no_other_stack_on_its_nodes_a_stack_takes_every_turn_at_once(tmp_path, monkeypatch, executor, prefix):
    """No other stack's memory claim on any of the nodes: no other stack can hold a turn there, so the turns are
    taken at once, not in a row; one other stack's claim on one node puts them back in order."""
    from components import preflight
    from components.nodes.node_facts import parse
    from test_preflight_checks import healthy

    def turns_after(facts):
        monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
        rec = run_program(stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True},
                                       serve={"executor": executor}))
        turns = {node: rec.by_name(f"{prefix}-load-turn-{node}") for node in ("spark1", "spark2", "spark3")}
        return {node: {rec.resources[urn].name for urn in turn.dependencies
                       if rec.resources[urn].name.startswith(prefix)} for node, turn in turns.items()}

    facts = healthy()
    if executor == "mp":
        facts["spark1"]["ports"] = {"29501": {"free": True}, "8000": {"free": True}, "29511": {"free": True}}
    for node in facts.values():
        node["claims"] = {"byStack": {"test": 0.85}}  # this stack's own claims only
    assert turns_after(facts) == {"spark1": set(), "spark2": set(), "spark3": set()}
    facts["spark2"]["claims"]["byStack"]["other"] = 0.01
    assert turns_after(facts) == {"spark1": set(), "spark2": {f"{prefix}-load-turn-spark1"},
                                  "spark3": {f"{prefix}-load-turn-spark2"}}
