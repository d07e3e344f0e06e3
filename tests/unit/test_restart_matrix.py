"""The restart matrix of the README, checked on a model of the engine: which replace-triggering inputs change.

Each case runs the real program twice under mocks, before and after a config change, and compares every
resource's replace key (harness.Registration.replace_key). Ids follow inputs, so a replaced head shows up in
its workers' inputs, as the engine's new id would. The lab suite checks the same matrix on the real engine.
"""

from __future__ import annotations

import pytest

from fixtures import cluster_with as cluster, models_with as models, stack_config, write_catalog
from harness import run_program

SECRET_KEYS = ("spark-vllm:apiKey",)
NODES = ("spark1", "spark2", "spark3")
# Each node's load turn is taken again before every new serve (one stack loads on a node at a time).
TURNS = {f"vllm-serve-load-turn-{n}" for n in NODES}
SERVE_CHAIN = {"vllm-serve-process", "serve-ready-gate"} | TURNS
GATE_AND_SERVE = {"cluster-ready-gate"} | SERVE_CHAIN
CONTAINERS = {"ray-head-container", "ray-worker-spark2-container", "ray-worker-spark3-container"}
GUARDS = {"fabric-guard-spark1-rules", "fabric-guard-spark2-rules", "fabric-guard-spark3-rules"}
# The watchdog's arm is replaced (so disarmed first) whenever a container or the serve is; its keepers only when
# what they keep or guard changes.
ARM = {"watchdog-arm"}
CLAIMS = {"memory-claim-spark1-volume", "memory-claim-spark2-volume", "memory-claim-spark3-volume"}
KEEPERS = {"watchdog-keeper-spark1", "watchdog-keeper-spark2", "watchdog-keeper-spark3"}


def deploy(tmp_path, clusters=None, models=None, **stack):
    """Runs the program on the catalog as changed; every run uses the same folder, as a stack does."""
    catalog = write_catalog(tmp_path / "catalog", clusters, models)
    stack.setdefault("apiKey", "key-one")
    return {r.urn: r for r in run_program(stack_config(catalog, **stack), SECRET_KEYS).resources.values()}


def changes(before, after):
    """(replaced, created, deleted) resource names, with components (which have no provider inputs) left out."""
    custom = lambda r: not r.type.startswith("spark-vllm:")  # noqa: E731
    replaced = {r.name for urn, r in after.items()
                if urn in before and custom(r) and r.replace_key() != before[urn].replace_key()}
    created = {r.name for urn, r in after.items() if urn not in before and custom(r)}
    deleted = {r.name for urn, r in before.items() if urn not in after and custom(r)}
    return replaced, created, deleted


FOUR_NODES = cluster(lambda c: c["nodes"].append(
    {"name": "spark4", "ssh": {"host": "192.168.200.4", "via": "spark1"}, "fabricIp": "192.168.200.4"}))

# (id, the change as deploy() kwargs, replaced, created)
MATRIX = [
    ("no change", {}, set(), set()),
    ("max model len", dict(serve={"maxModelLen": 4096}), SERVE_CHAIN | ARM, set()),
    # The claims on the nodes carry the fraction for other stacks' preflight: replaced too, restarting nothing.
    ("gpu memory utilization", dict(serve={"gpuMemoryUtilization": 0.8}), SERVE_CHAIN | ARM | CLAIMS, set()),
    ("enforce eager off", dict(serve={"enforceEager": False}), SERVE_CHAIN | ARM, set()),
    ("extra args", dict(serve={"extraArgs": ["--max-num-batched-tokens", "8192"]}), SERVE_CHAIN | ARM, set()),
    ("api key", dict(apiKey="key-two"), SERVE_CHAIN | ARM, set()),
    ("one worker's env", dict(clusters=cluster(lambda c: c["nodes"][2].update(env={"NCCL_DEBUG": "INFO"}))),
     {"ray-worker-spark3-container"} | GATE_AND_SERVE | ARM, set()),
    ("head's env", dict(clusters=cluster(lambda c: c["nodes"][0].update(env={"NCCL_DEBUG": "INFO"}))),
     CONTAINERS | GATE_AND_SERVE | ARM, set()),
    ("ray port", dict(clusters=cluster(lambda c: c["ray"].update(port=6390))),
     GUARDS | CONTAINERS | GATE_AND_SERVE | ARM | KEEPERS, set()),
    ("cluster-wide env", dict(clusters=cluster(lambda c: c["env"].update(NCCL_DEBUG="INFO"))),
     CONTAINERS | GATE_AND_SERVE | ARM, set()),
    # pulumi-docker plans a mount change as an in-place update that keeps the old mount; "*" replaces.
    ("weights path", dict(models=models(lambda m: m["big"].update(path="/models/other"))),
     CONTAINERS | GATE_AND_SERVE | ARM, set()),
    ("image", dict(models=models(lambda m: m["big"].update(image="vllm:b"))),
     CONTAINERS | GATE_AND_SERVE | {"spark1-image", "spark2-image", "spark3-image"} | ARM | KEEPERS, set()),
    # The leader learns of a new follower: the head's keeper only.
    ("a node added", dict(clusters=FOUR_NODES, serve={"tensorParallel": 4}),
     GATE_AND_SERVE | ARM | {"watchdog-keeper-spark1"},
     {"spark4-docker", "spark4-image", "fabric-guard-spark4-rules", "ray-worker-spark4-container",
      "watchdog-keeper-spark4", "memory-claim-spark4-volume", "vllm-serve-load-turn-spark4"}),
]


@pytest.mark.parametrize("change,replaced,created", [c[1:] for c in MATRIX], ids=[c[0] for c in MATRIX])
def test_restart_matrix(tmp_path, change, replaced, created):
    before = deploy(tmp_path)
    after = deploy(tmp_path, **change)
    assert changes(before, after) == (replaced, created, set())


# The same matrix with `executor: mp`: a torch.distributed group cannot take back one rank, so whatever restarts
# one rank restarts all of them, with the gates; the guard and the sync only on their own inputs.
MP_RANKS = {"vllm-rank-spark1-container", "vllm-rank-spark2-container", "vllm-rank-spark3-container"}
MP_GATES = {"ranks-ready-spark1-gate", "ranks-ready-spark2-gate", "ranks-ready-spark3-gate", "serve-ready-gate"}
MP_TURNS = {f"mp-serve-load-turn-{n}" for n in NODES}
MP_ALL = MP_RANKS | MP_GATES | MP_TURNS


def mp(change=lambda m: None):
    return models(lambda m: (m["big"].update(executor="mp"), change(m)))


MP_MATRIX = [
    ("no change", {}, set(), set()),
    ("max model len", dict(serve={"maxModelLen": 4096}), MP_ALL | ARM, set()),
    ("gpu memory utilization", dict(serve={"gpuMemoryUtilization": 0.8}), MP_ALL | ARM | CLAIMS, set()),
    ("enforce eager off", dict(serve={"enforceEager": False}), MP_ALL | ARM, set()),
    ("extra args", dict(serve={"extraArgs": ["--max-num-batched-tokens", "8192"]}), MP_ALL | ARM, set()),
    ("api key", dict(apiKey="key-two"), MP_ALL | ARM, set()),
    ("one worker's env", dict(clusters=cluster(lambda c: c["nodes"][2].update(env={"NCCL_DEBUG": "INFO"}))),
     MP_ALL | ARM, set()),
    ("master port", dict(clusters=cluster(lambda c: c.update(mp={"masterPort": 29600}))),
     GUARDS | MP_ALL | ARM | KEEPERS, set()),
    # Ray's ports are not mp's: the guard covers only what the ranks open.
    ("ray port", dict(clusters=cluster(lambda c: c["ray"].update(port=6390))), set(), set()),
    ("weights path", dict(models=mp(lambda m: m["big"].update(path="/models/other"))), MP_ALL | ARM, set()),
    ("image", dict(models=mp(lambda m: m["big"].update(image="vllm:b"))),
     MP_ALL | {"spark1-image", "spark2-image", "spark3-image"} | ARM | KEEPERS, set()),
    ("a node added", dict(clusters=FOUR_NODES, serve={"tensorParallel": 4}), MP_ALL | ARM | {"watchdog-keeper-spark1"},
     {"spark4-docker", "spark4-image", "fabric-guard-spark4-rules", "vllm-rank-spark4-container",
      "ranks-ready-spark4-gate", "watchdog-keeper-spark4", "memory-claim-spark4-volume", "mp-serve-load-turn-spark4"}),
]


@pytest.mark.parametrize("change,replaced,created", [c[1:] for c in MP_MATRIX], ids=[c[0] for c in MP_MATRIX])
def test_restart_matrix_mp(tmp_path, change, replaced, created):
    before = deploy(tmp_path, models=mp())
    after = deploy(tmp_path, **{"models": mp(), **change})
    assert changes(before, after) == (replaced, created, set())


def test_ray_to_mp_replaces_the_engine_and_keeps_nodes_and_images(tmp_path):
    """The engine deletes what left the program only at the end of `up`: see the README on switching."""
    before = deploy(tmp_path)
    after = deploy(tmp_path, models=mp())
    replaced, created, deleted = changes(before, after)
    # The guards: Ray's ports closed no more, the master port now; the keepers keep the ranks now.
    assert replaced == GUARDS | {"serve-ready-gate"} | ARM | KEEPERS
    assert created == MP_ALL - {"serve-ready-gate"}
    assert deleted == CONTAINERS | {"cluster-ready-gate", "vllm-serve-process"} | TURNS


@pytest.mark.parametrize("executor, replaced", [("ray", CONTAINERS | GATE_AND_SERVE | ARM), ("mp", MP_ALL | ARM)])
def test_host_nccl_on_or_off_restarts_the_engine_alone(tmp_path, monkeypatch, executor, replaced):
    """nccl.hostLibrary (docs/host-nccl.md) changes one mount of every engine container: what a head's env change
    restarts with Ray, every rank with mp; never a guard, a claim, an image or a keeper."""
    from components import preflight
    from components.nodes.node_facts import parse
    from components.preflight import liveness
    from test_host_nccl_checks import with_nccl

    facts = with_nccl()
    facts["spark1"]["ports"] = {**facts["spark1"]["ports"], "29501": {"free": True}}
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    # The life tokens of what is not yet deployed are the run's time: one time for every run here.
    monkeypatch.setattr(preflight, "judge", lambda d, f: liveness.judge(d, f, stamp="20261208T000000Z"))
    settings = dict(models=mp() if executor == "mp" else None, preflight={"enabled": True})
    off = deploy(tmp_path, **settings)
    assert changes(off, deploy(tmp_path, **settings)) == (set(), set(), set())  # the control: no change, no diff
    on = deploy(tmp_path, **settings, nccl={"hostLibrary": True})
    assert changes(off, on) == (replaced, set(), set())
    assert changes(on, deploy(tmp_path, **settings)) == (replaced, set(), set())
