"""The program with `executor: mp` under Pulumi's mocks: one `vllm serve` rank container a node, pinned like Ray's,
the gates, the options that restart every rank together, and the secrets."""

from __future__ import annotations

import pytest

from fixtures import cluster_with, models_with, stack_config, write_catalog
from harness import plain_strings, run_program

API_KEY = "sk-unit-test-api-key-123"
HF_TOKEN = "hf_unit_test_token_456"
CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"
RANKS = ("vllm-rank-spark1-container", "vllm-rank-spark2-container", "vllm-rank-spark3-container")
MP = models_with(lambda m: m["big"].update(executor="mp"))


@pytest.fixture
def rec(tmp_path):
    catalog = write_catalog(tmp_path / "catalog", models=MP)
    return run_program(stack_config(catalog, apiKey=API_KEY, hfToken=HF_TOKEN),
                       secret_keys=("spark-vllm:apiKey", "spark-vllm:hfToken"))


def unsecret(value):
    """The value inside Pulumi's secret wrapper (what the engine stores encrypted), or the value itself."""
    return value["value"] if isinstance(value, dict) and "value" in value else value


def env_of(reg) -> dict[str, str]:
    return dict(e.split("=", 1) for e in unsecret(reg.inputs["envs"]))


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_no_ray_at_all_one_rank_a_node(rec):
    nodes = ("spark1", "spark2", "spark3")
    assert rec.names(CONTAINER) == {*RANKS, *(f"watchdog-keeper-{n}" for n in nodes)}
    assert rec.names(COMMAND) == {"serve-ready-gate", "watchdog-arm", *(f"ranks-ready-{n}-gate" for n in nodes),
                                  *(f"fabric-guard-{n}-rules" for n in nodes),
                                  *(f"memory-claim-{n}-volume" for n in nodes),
                                  *(f"mp-serve-load-turn-{n}" for n in nodes)}
    assert not any("ray" in name.replace("ready", "") for name in rec.names())
    for node in ("spark1", "spark2", "spark3"):
        assert rec.by_name(f"vllm-rank-{node}-container").provider.startswith(rec.by_name(f"{node}-docker").urn)


def test_each_rank_is_the_containers_own_vllm_serve(rec):
    for rank, name in enumerate(RANKS):
        c = rec.by_name(name).inputs
        argv = c["command"]
        assert c["entrypoints"] == ["vllm"] and argv[:2] == ["serve", "/models/big"]
        assert flag(argv, "--distributed-executor-backend") == "mp"
        assert flag(argv, "--tensor-parallel-size") == "3" and flag(argv, "--pipeline-parallel-size") == "1"
        assert flag(argv, "--nnodes") == "3" and flag(argv, "--node-rank") == str(rank)
        # The master is the head's fabric address, never its management address (the seed's c10d failure).
        assert flag(argv, "--master-addr") == "192.168.200.1" and flag(argv, "--master-port") == "29501"
        assert ("--headless" in argv) == (rank > 0)
        assert c["name"] == f"spark-vllm-test-vllm-rank{rank}"


def test_ranks_are_pinned_to_the_fabric_without_ray_variables(rec):
    for name, ip in zip(RANKS, ("192.168.200.1", "192.168.200.2", "192.168.200.3")):
        env = env_of(rec.by_name(name))
        assert env["VLLM_HOST_IP"] == ip
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME",
                    "OMPI_MCA_btl_tcp_if_include"):
            assert env[var] == "enp1s0f1np1"
        assert env["MASTER_ADDR"] == "192.168.200.1" and env["NCCL_IB_HCA"] == "rocep1s0f1"
        assert not any(var.startswith("RAY_") or var.endswith("_METRIC_PORT") for var in env), env


def test_ranks_share_ray_containers_runtime_settings(rec):
    c = rec.by_name(RANKS[1]).inputs
    assert c["networkMode"] == "host" and c["ipcMode"] == "host" and c["shmSize"] == 10240 and c["gpus"] == "all"
    assert c["capabilities"] == {"adds": ["CAP_IPC_LOCK"]} and c["restart"] == "no"
    assert {"target": "/models/big", "source": "/models/big", "type": "bind", "readOnly": True} in c["mounts"]


def test_every_rank_restarts_together(rec):
    head = rec.by_name(RANKS[0])
    digests = set()
    for name in RANKS:
        r = rec.by_name(name)
        assert r.replace_on_changes == ["*"] and r.delete_before_replace, name
        # A secret: the digest takes the secrets in.
        found = {item["label"]: unsecret(item["value"]) for item in unsecret(r.inputs["labels"])}
        digests.add(found["spark-vllm.ranks-digest"])
        if r is not head:
            assert r.replace_with == [head.urn] and found["spark-vllm.head-id"] == head.id
    assert len(digests) == 1


def test_gates_run_on_the_nodes_bounded(rec):
    for node, ip in (("spark1", "10.10.10.11"), ("spark2", "192.168.200.2"), ("spark3", "10.10.10.13")):
        gate = rec.by_name(f"ranks-ready-{node}-gate").inputs
        assert gate["create"] == (
            f"timeout -k 10 270 python3 - --node={node} --container=spark-vllm-test-vllm-rank"
            f"{('spark1', 'spark2', 'spark3').index(node)} --master=192.168.200.1:29501 --head-node=spark1 "
            "--interface=enp1s0f1np1 --timeout=180")
        assert gate["connection"]["value"]["host"] == ip
    ready = rec.by_name("serve-ready-gate")
    assert ready.inputs["create"].startswith("timeout -k 10 2490 python3 - --node=spark1 ")
    assert "--container=spark-vllm-test-vllm-rank0" in ready.inputs["create"]
    for node in ("spark1", "spark2", "spark3"):
        assert rec.by_name(f"ranks-ready-{node}-gate").urn in ready.dependencies
    # The head's gate first: a master off the fabric is named there at once, not after the workers' bounds.
    head_gate = rec.by_name("ranks-ready-spark1-gate")
    assert not any("ranks-ready" in urn for urn in head_gate.dependencies)
    for node in ("spark2", "spark3"):
        assert head_gate.urn in rec.by_name(f"ranks-ready-{node}-gate").dependencies


def test_the_guard_covers_the_master_port_and_the_ranks_random_ports(rec):
    create = rec.by_name("fabric-guard-spark2-rules").inputs["create"]
    assert create.endswith("enp1s0f1np1 'spark-vllm stack test' 29501 29511 ephemeral"), create


def test_secrets_only_in_rank0_and_never_plain(rec):
    for reg in rec.resources.values():
        for text in plain_strings(reg.inputs):
            for secret in (API_KEY, HF_TOKEN, "unit-test-key-material"):
                assert secret not in text, f"{secret!r} in plain input of {reg.name}"
    head = env_of(rec.by_name(RANKS[0]))
    assert head["VLLM_API_KEY"] == API_KEY and head["HF_TOKEN"] == HF_TOKEN
    assert "VLLM_API_KEY" not in env_of(rec.by_name(RANKS[1]))


def test_weights_sync_and_page_cache_drop_come_before_the_ranks(tmp_path, monkeypatch):
    catalog = write_catalog(tmp_path / "catalog", models=models_with(
        lambda m: m["big"].update(executor="mp", dropPageCache=True)))
    rec = run_program(stack_config(catalog))
    drops = {n: rec.by_name(f"mp-serve-drop-cache-{n}").urn for n in ("spark1", "spark2", "spark3")}
    for name in RANKS:
        assert set(drops.values()) <= set(rec.by_name(name).dependencies), name


def test_a_single_node_mp_model(tmp_path):
    catalog = write_catalog(tmp_path / "catalog", clusters=cluster_with(lambda c: c.update(nodes=c["nodes"][:1])),
                            models=models_with(lambda m: m["small"].update(executor="mp")))
    rec = run_program(stack_config(catalog, model="small"))
    argv = rec.by_name("vllm-rank-spark1-container").inputs["command"]
    # One node: plain `vllm serve`, no rendezvous, so no ranks-ready gate waiting for a master.
    assert not {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} & set(argv)
    assert not [name for name in rec.names() if name.startswith("ranks-ready")]
