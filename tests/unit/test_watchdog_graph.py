"""The watchdog's graph under Pulumi's mocks (a keeper a node, the arm and its options), and its config."""

from __future__ import annotations

import json

import pytest

from components.remote.keeper import BOOT
from fixtures import models_with, stack_config, write_catalog
from harness import run_program

API_KEY = "sk-unit-test-api-key-123"
NODES = ("spark1", "spark2", "spark3")
MP = models_with(lambda m: m["big"].update(executor="mp"))


def program(tmp_path, models=None, **stack):
    catalog = write_catalog(tmp_path / "catalog", models=models)
    return run_program(stack_config(catalog, apiKey=API_KEY, **stack),
                       secret_keys=("spark-vllm:apiKey", "spark-vllm:hfToken"))


def keeper_cfg(rec, node: str) -> dict:
    command = rec.by_name(f"watchdog-keeper-{node}").inputs["command"]
    assert command[:2] == ["-c", BOOT]
    return json.loads(command[3])


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_a_keeper_a_node_that_outlives_what_it_keeps(tmp_path, executor):
    rec = program(tmp_path, models=MP if executor == "mp" else None)
    kept = {"ray": {"spark1": "spark-vllm-test-ray-head", "spark2": "spark-vllm-test-ray-worker"},
            "mp": {"spark1": "spark-vllm-test-vllm-rank0", "spark2": "spark-vllm-test-vllm-rank1"}}[executor]
    for node in NODES:
        keeper = rec.by_name(f"watchdog-keeper-{node}")
        c = keeper.inputs
        assert c["name"] == "spark-vllm-test-keeper" and c["restart"] == "unless-stopped"
        assert (c["networkMode"], c["pidMode"]) == ("host", "host")
        assert keeper.provider.startswith(rec.by_name(f"{node}-docker").urn)
        assert keeper.delete_before_replace
        # The guard's rules are in before the keeper can put them back itself.
        assert rec.by_name(f"fabric-guard-{node}-rules").urn in keeper.dependencies
        mounts = {(m["type"], m.get("source"), m["target"]) for m in c["mounts"]}
        assert mounts == {("bind", "/var/run/docker.sock", "/var/run/docker.sock"),
                          ("volume", "spark-vllm-test", "/var/lib/spark-vllm")}
        cfg = keeper_cfg(rec, node)
        assert cfg["executor"] == executor and cfg["guard"]["chain"].startswith("svl-test-")
        if node in kept:
            assert cfg["containers"] == [kept[node]]
    lead, follow = keeper_cfg(rec, "spark1"), keeper_cfg(rec, "spark2")
    assert (lead["role"], lead["bind"], lead["port"], lead["followers"]) == (
        "leader", "192.168.200.1", 29511, ["spark2", "spark3"])
    assert (follow["role"], follow["leader"]) == ("follower", "192.168.200.1:29511")
    assert lead["watchdog"] == {"interval": 30, "probeTimeout": 60, "failures": 3, "backoffInitial": 10,
                                "backoffMax": 600, "maxRestarts": 3, "window": 3600, "loadTimeout": 2400}
    assert ("ray" in lead) == (executor == "ray")


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_the_arm_follows_the_serve_and_goes_before_anything_up_replaces(tmp_path, executor):
    rec = program(tmp_path, models=MP if executor == "mp" else None)
    arm = rec.by_name("watchdog-arm")
    assert rec.by_name("serve-ready-gate").urn in arm.dependencies
    # Replaced (so deleted: disarmed, and first) whenever a container, the serve or a keeper is.
    assert arm.delete_before_replace and "*" in arm.replace_on_changes
    engines = (["ray-head-container", "ray-worker-spark2-container", "ray-worker-spark3-container",
                "vllm-serve-process"] if executor == "ray" else
               [f"vllm-rank-{n}-container" for n in NODES])
    watched = [rec.by_name(name).id for name in engines] + [rec.by_name(f"watchdog-keeper-{n}").id for n in NODES]
    assert arm.inputs["triggers"] == watched
    assert "python3 /keeper.py arm " in arm.inputs["create"]
    assert "python3 /keeper.py disarm 300" in arm.inputs["delete"]
    assert arm.inputs["delete"].startswith("if [ \"$(docker inspect -f '{{.State.Running}}' spark-vllm-test-keeper")


def test_no_secret_reaches_a_keeper(tmp_path):
    rec = program(tmp_path, hfToken="hf_unit_test_token_456")
    for node in NODES:
        text = json.dumps(rec.by_name(f"watchdog-keeper-{node}").inputs)
        assert API_KEY not in text and "hf_unit_test_token_456" not in text


def test_turned_off_there_is_no_keeper_and_no_port(tmp_path):
    rec = program(tmp_path, watchdog={"enabled": False})
    assert not [n for n in rec.names() if n.startswith("watchdog")]
    assert "29511" not in rec.by_name("fabric-guard-spark1-rules").inputs["create"]
