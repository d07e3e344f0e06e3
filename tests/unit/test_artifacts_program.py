"""The artifacts in the program's graph: the image brought to each node before anything there uses it, the Hub
download before every sync, each engine after its node's weights, and none of them running on a no-op."""

from __future__ import annotations

import base64
import json

from components import preflight
from components.nodes import hub_client
from components.nodes.node_facts import parse
from components.resources.vllm_serve import ENV_FILE  # noqa: F401  (the serve's module loads with the program)
from fixtures import models_with, stack_config, write_catalog
from harness import plain_strings, run_program
from test_artifact_checks import COMMIT, FILES, WANTED, Hub, empty, record, with_weights
from test_preflight_checks import OTHER_ID, healthy

COMMAND = "command:remote:Command"
TOKEN = "hf_unit_token_material"
PASSWORD = "nvapi-unit-password-material"
IGNORED = ["triggers", "create", "stdin", "connection"]


def program(tmp_path, monkeypatch, facts, hub=True, ask=None, secrets=True, serve=None, **extra):
    monkeypatch.setattr(preflight, "probe", lambda d, node: parse(facts[node.name]))
    monkeypatch.setattr(hub_client, "ask", ask or Hub())
    models = models_with(lambda m: m["big"].update(tensorParallel=3, **({"hub": {"repo": "lab/tiny"}} if hub else {})))
    config = stack_config(write_catalog(tmp_path / "catalog", models=models), preflight={"enabled": True}, **extra)
    if serve:
        config["spark-vllm:serve"] = serve
    keys = ()
    if secrets:
        config.update({"spark-vllm:hfToken": TOKEN, "spark-vllm:registryPassword": PASSWORD})
        keys = ("spark-vllm:hfToken", "spark-vllm:registryPassword")
    return run_program(config, keys)


def first_download(tmp_path, monkeypatch, **kwargs):
    facts = healthy()
    empty(facts, "spark1", "spark2", "spark3")
    return program(tmp_path, monkeypatch, facts, **kwargs)


def test_the_download_runs_on_the_head_in_the_image_with_the_token_a_secret(tmp_path, monkeypatch):
    rec = first_download(tmp_path, monkeypatch)
    component, download = rec.by_name("weights-download"), rec.by_name("weights-download-spark1")
    assert component.type == "spark-vllm:index:WeightsDownload" and download.parent == component.urn
    assert download.inputs["create"] == "sh -s -- spark-vllm-test-hub-download vllm:a /models/big"
    assert download.inputs["connection"]["value"]["host"] == "10.10.10.11"
    triggers = download.inputs["triggers"]
    assert triggers[0] == f"lab/tiny@{COMMIT} (main)" and triggers[1].startswith("3 files ")
    assert triggers[2].startswith("found short at 20") and download.ignore_changes == []
    assert rec.by_name("spark1-image").urn in download.dependencies
    # The token only inside the secret stdin, base64-encoded in the program it carries.
    stdin = download.inputs["stdin"]
    assert plain_strings(stdin) == [] and base64.b64encode(TOKEN.encode()).decode() in stdin["value"]
    for reg in rec.resources.values():
        assert not any(TOKEN in text or PASSWORD in text for text in plain_strings(reg.inputs)), reg.name
    spec = json.loads(base64.b64decode(stdin["value"].split('SPEC = json.loads(base64.b64decode("')[1].split('"')[0]))
    assert spec["fetch"] == [path for path, _ in WANTED] and spec["commit"] == COMMIT
    assert [f[0] for f in spec["files"]] == [f.path for f in FILES]
    assert rec.outputs["weights"] == {"repo": "lab/tiny", "commit": COMMIT}


def test_every_sync_follows_the_download_and_every_engine_its_nodes_weights(tmp_path, monkeypatch):
    rec = first_download(tmp_path, monkeypatch)
    download = rec.by_name("weights-download-spark1")
    syncs = [rec.by_name(f"weights-sync-{node}") for node in ("spark2", "spark3")]
    for sync in syncs:
        assert download.urn in sync.dependencies and sync.ignore_changes == []
        # Compared by size and time: a new revision's file may keep its size.
        assert " rsync -a --whole-file --copy-links '--exclude=/.*' '--rsync-path=" in sync.inputs["create"]
    # Nothing that runs is replaced before every node's weights are in place: each engine waits for all of them.
    for engine in ("ray-head-container", "ray-worker-spark2-container", "ray-worker-spark3-container"):
        assert {download.urn, *(s.urn for s in syncs)} <= set(rec.by_name(engine).dependencies)


def test_a_no_op_changes_nothing_and_runs_nothing(tmp_path, monkeypatch):
    facts = healthy()
    for node in facts:
        with_weights(facts, node, hub=record() if node == "spark1" else None)
    ask = Hub()
    rec = program(tmp_path, monkeypatch, facts, ask=ask)
    assert ask.asked == []
    assert rec.by_name("weights-download-spark1").ignore_changes == IGNORED
    assert rec.by_name("weights-download-spark1").inputs["triggers"][2:] == []
    for node in ("spark2", "spark3"):
        assert rec.by_name(f"weights-sync-{node}").ignore_changes == IGNORED
        assert rec.by_name(f"image-transfer-{node}").ignore_changes == IGNORED


def test_a_new_commit_restarts_the_serve_and_a_repair_does_not(tmp_path, monkeypatch):
    # Nothing runs in these facts: every piece gets the token of "now", which must be the same in every run.
    from components.preflight import liveness
    monkeypatch.setattr(liveness.time, "strftime", lambda fmt, t=None: "20261207T120000Z")

    def serve_triggers(commit, lost=False):
        facts = healthy()
        for node in facts:
            with_weights(facts, node, hub=record(commit=commit) if node == "spark1" else None)
        if lost:
            with_weights(facts, "spark1", files=WANTED[:2], hub=record(commit=commit))
        rec = program(tmp_path, monkeypatch, facts, ask=Hub())  # one catalog: its key file's path is in every id
        return rec.by_name("vllm-serve-process").inputs["triggers"]

    now = serve_triggers(COMMIT)
    assert f"weights {COMMIT}" in now
    assert serve_triggers(COMMIT, lost=True) == now  # the lost file comes back; the running vLLM has the weights
    mp = {}
    for commit in (COMMIT, "1" * 40):
        facts = healthy()
        for node in facts:
            with_weights(facts, node, hub=record(revision=commit, commit=commit) if node == "spark1" else None)
        facts["spark1"]["ports"] = {"29501": {"free": True}, "8000": {"free": True}, "29511": {"free": True}}
        rec = program(tmp_path, monkeypatch, facts, serve={"executor": "mp", "hub": {"revision": commit}})
        mp[commit] = rec.by_name("vllm-rank-spark1-container").inputs["labels"]
    assert mp[COMMIT] != mp["1" * 40]  # every rank restarts on new weights


def test_a_cache_snapshot_is_mounted_with_its_blobs(tmp_path, monkeypatch):
    facts = healthy()
    snapshot = "/models/big"
    facts["spark1"]["model"]["mountRoot"] = "/models"
    facts["spark1"]["model"]["links"] = 5
    rec = program(tmp_path, monkeypatch, facts, hub=False, serve={"path": snapshot})
    mounts = {m["target"]: m for m in rec.by_name("ray-head-container").inputs["mounts"]}
    assert mounts["/models"] == {"type": "bind", "source": "/models", "target": "/models", "readOnly": True}
    worker = {m["target"] for m in rec.by_name("ray-worker-spark2-container").inputs["mounts"]}
    assert "/models/big" in worker and "/models" not in worker


def test_each_node_short_of_the_image_gets_the_heads_before_anything_there(tmp_path, monkeypatch):
    facts = healthy()
    facts["spark2"]["image"] = {"present": False}
    facts["spark3"]["image"]["id"] = OTHER_ID
    rec = program(tmp_path, monkeypatch, facts, hub=False)
    assert rec.by_name("image-transfer").type == "spark-vllm:index:ImageTransfer"
    assert not any(r.name == "image-transfer-spark1" for r in rec.resources.values())  # the reference keeps its own
    for node, ip in (("spark2", "192.168.200.2"), ("spark3", "192.168.200.3")):
        copy = rec.by_name(f"image-transfer-{node}")
        assert copy.inputs["connection"]["value"]["host"] == "10.10.10.11"  # it runs on the head, the reference
        assert copy.inputs["create"].startswith(f"python3 - vllm:a {healthy()['spark1']['image']['id']} {node} {ip} "
                                                "300 ssh ")
        assert copy.inputs["create"].endswith(f" nvidia@{ip}")
        assert copy.ignore_changes == [] and copy.inputs["triggers"][1].startswith(
            f"{node} lacks it at " if node == "spark2" else f"{node} holds another build (sha256:cd34cd34cd34) at ")
        image = rec.by_name(f"{node}-image")
        assert copy.urn in image.dependencies and image.replacement_trigger is not None
        assert copy.urn in rec.by_name("ray-head-container").dependencies  # every engine waits for every copy
        # The containers run the id the copy brings, not the one the node held.
        assert rec.by_name(f"ray-worker-{node}-container").inputs["image"] == healthy()["spark1"]["image"]["id"]


def test_a_head_that_pulls_does_so_with_the_password_a_secret(tmp_path, monkeypatch):
    facts = healthy()
    facts["spark1"]["image"] = {"present": False}
    rec = program(tmp_path, monkeypatch, facts, hub=False,
                  images={"pull": "head", "registryUser": "$oauthtoken"})
    pull = rec.by_name("image-transfer-spark1")
    assert pull.inputs["create"] == "python3 - vllm:a docker.io '$oauthtoken' '' 300 spark1"
    stdin = pull.inputs["stdin"]
    assert plain_strings(stdin) == [] and base64.b64encode(PASSWORD.encode()).decode() in stdin["value"]
    copy = rec.by_name("image-transfer-spark2")
    assert pull.urn in copy.dependencies  # the others copy the head's once it holds it
    # Pulled, its id is the registry's: the head's containers take the image's id once it is read after the pull.
    assert rec.by_name("spark1-image").replacement_trigger is not None
