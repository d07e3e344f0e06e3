"""The artifacts' plans and preflight rows: what the Hub download fetches and when the Hub is asked, which node copies
or pulls the image, and the hub, weights, space and architecture rows that say so before anything changes."""

from __future__ import annotations

import pytest

from components.config import loader
from components.nodes import hub_plan, image_plan
from components.nodes.hub_client import HubAnswer
from components.nodes.hub_files import RepoFile
from components.nodes.image_plan import Action, NodeImage
from components.preflight import liveness
from components.preflight.judging import evaluate
from fixtures import models_with, stack_config, write_catalog
from harness import ROOT
from test_preflight_checks import GIB, IMAGE_ID, OTHER_ID, healthy, typed

REPO = "lab/tiny"
COMMIT = "31f1f07b7fd598bddcdfad1e348f44008a6cfab5"
OLD = "0" * 40
SHARD = 4 * GIB
FILES = [RepoFile("config.json", 900, "c1"), RepoFile("model-00001-of-00002.safetensors", SHARD, "s1"),
         RepoFile("model-00002-of-00002.safetensors", SHARD, "s2"), RepoFile("README.md", 100, "r1"),
         RepoFile("original/consolidated.00.pth", 3 * GIB, "p1")]
WANTED = [["config.json", 900], ["model-00001-of-00002.safetensors", SHARD],
          ["model-00002-of-00002.safetensors", SHARD]]


def deployment(tmp_path, hub=None, **extra):
    hub = {"repo": REPO, **(hub or {})}
    models = models_with(lambda m: m["big"].update(hub=hub, tensorParallel=3))
    return loader.load("test", stack_config(write_catalog(tmp_path / "catalog", models=models),
                                            preflight={"enabled": True}, **extra), set(), ROOT)


class Hub:
    """A stand-in for hub_client.ask that records each question."""

    def __init__(self, answer=None):
        self.answer = answer or HubAnswer(commit=COMMIT, files=tuple(FILES),
                                          config={"architectures": ["Qwen3ForCausalLM"]})
        self.asked = []

    def __call__(self, hub, token):
        self.asked.append((hub.revision, token))
        return self.answer


def record(revision="main", commit=COMMIT, complete=True, files=FILES):
    return {"repo": REPO, "revision": revision, "commit": commit, "complete": complete,
            "files": [[f.path, f.size, f.etag] for f in files]}


def with_weights(facts, node, files=WANTED, hub=None):
    facts[node]["model"] = {"exists": True, "files": [list(f) for f in files],
                            "config": {"architectures": ["Qwen3ForCausalLM"]}, **({"hub": hub} if hub else {})}


def empty(facts, *nodes):
    for node in nodes:
        facts[node]["model"] = {"exists": False, "isFile": False}


# ---- the Hub download's plan ----

def test_a_first_download_asks_the_hub_once_and_fetches_what_vllm_reads(tmp_path):
    d, facts, ask = deployment(tmp_path), healthy(), Hub()
    empty(facts, "spark1", "spark2", "spark3")
    plan = hub_plan.plan(d, typed(facts), ask, "hf_token")
    assert ask.asked == [("main", "hf_token")]
    assert plan.commit == COMMIT and plan.asked and plan.needed
    assert [f.path for f in plan.to_fetch] == [path for path, _ in WANTED]
    assert plan.wanted() == dict((p, n) for p, n in WANTED)
    assert [(f.path, why) for f, why in plan.selection.skipped] == [
        ("README.md", "not a file vLLM reads"), ("original/consolidated.00.pth", "excluded (original/*)")]


def test_the_nodes_record_answers_a_no_op_without_the_hub(tmp_path):
    d, facts, ask = deployment(tmp_path), healthy(), Hub()
    with_weights(facts, "spark1", hub=record())
    plan = hub_plan.plan(d, typed(facts), ask, None)
    assert ask.asked == [] and not plan.asked and not plan.needed and plan.commit == COMMIT
    # Pinned to the commit the record holds: the same.
    pinned = deployment(tmp_path / "pinned", hub={"revision": COMMIT})
    assert not hub_plan.plan(pinned, typed(facts), ask, None).needed and ask.asked == []


def test_a_lost_file_is_fetched_again_without_asking(tmp_path):
    d, facts, ask = deployment(tmp_path), healthy(), Hub()
    with_weights(facts, "spark1", files=WANTED[:2], hub=record())
    plan = hub_plan.plan(d, typed(facts), ask, None)
    assert ask.asked == [] and plan.needed and [f.path for f in plan.to_fetch] == ["model-00002-of-00002.safetensors"]


def test_an_unfinished_download_runs_again(tmp_path):
    d, facts, ask = deployment(tmp_path), healthy(), Hub()
    with_weights(facts, "spark1", hub=record(complete=False))
    plan = hub_plan.plan(d, typed(facts), ask, None)
    assert ask.asked == [] and plan.needed and plan.to_fetch == ()


def test_another_revision_asks_the_hub_and_fetches_what_changed(tmp_path):
    d, facts = deployment(tmp_path, hub={"revision": "v2"}), healthy()
    changed = [FILES[0], RepoFile("model-00001-of-00002.safetensors", SHARD, "s1"),
               RepoFile("model-00002-of-00002.safetensors", SHARD + 1, "s2-new")]
    ask = Hub(HubAnswer(commit=COMMIT, files=tuple(changed)))
    with_weights(facts, "spark1", hub=record(revision="main", commit=OLD))
    plan = hub_plan.plan(d, typed(facts), ask, None)
    assert ask.asked == [("v2", None)] and plan.needed
    assert [f.path for f in plan.to_fetch] == ["model-00002-of-00002.safetensors"]


def test_a_file_of_the_same_size_and_another_etag_is_fetched(tmp_path):
    d, facts = deployment(tmp_path, hub={"revision": "v2"}), healthy()
    changed = [*FILES[:2], RepoFile("model-00002-of-00002.safetensors", SHARD, "s2-new"), *FILES[3:]]
    with_weights(facts, "spark1", hub=record(revision="main", commit=OLD))
    plan = hub_plan.plan(d, typed(facts), Hub(HubAnswer(commit=COMMIT, files=tuple(changed))), None)
    assert [f.path for f in plan.to_fetch] == ["model-00002-of-00002.safetensors"]


def test_a_refusal_of_the_hub_is_the_plans_error(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    plan = hub_plan.plan(d, typed(facts), Hub(HubAnswer(error="lab/tiny on x is gated and no hfToken is set")), None)
    assert plan.error == "lab/tiny on x is gated and no hfToken is set" and plan.commit is None
    facts["spark1"] = {"sshError": "failed: timed out"}
    assert hub_plan.plan(d, typed(facts), Hub(), None).error == \
        "what spark1 holds at /models/big is unknown (its probe did not run)"


# ---- the image's plan ----

def test_the_head_is_the_reference_and_the_others_copy_its_build(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    facts["spark2"]["image"] = {"present": False}
    facts["spark3"]["image"]["id"] = OTHER_ID
    plan = image_plan.plan(d, typed(facts))
    assert plan.reference == "spark1"
    assert plan.nodes == {"spark1": NodeImage(Action.KEEP, wanted_id=IMAGE_ID),
                          "spark2": NodeImage(Action.COPY, "spark1", IMAGE_ID, 20 * GIB),
                          "spark3": NodeImage(Action.COPY, "spark1", IMAGE_ID, 20 * GIB, holds=OTHER_ID)}


def test_a_head_without_the_image_pulls_it_or_copies_it(tmp_path):
    facts = healthy()
    facts["spark1"]["image"] = {"present": False}
    copied = image_plan.plan(deployment(tmp_path / "a"), typed(facts))
    assert copied.reference == "spark2" and copied.nodes["spark1"] == NodeImage(Action.COPY, "spark2", IMAGE_ID,
                                                                                20 * GIB)
    pulled = image_plan.plan(deployment(tmp_path / "b", images={"pull": "head"}), typed(facts))
    assert pulled.reference == "spark1" and pulled.nodes["spark1"] == NodeImage(Action.PULL)
    # What the head pulls is known once pulled: the others copy it then, and move nothing when it is theirs.
    assert pulled.nodes["spark2"] == NodeImage(Action.COPY, "spark1", None, None, holds=IMAGE_ID)


def test_with_pull_all_every_node_short_of_it_pulls(tmp_path):
    d, facts = deployment(tmp_path, images={"pull": "all"}), healthy()
    facts["spark3"]["image"] = {"present": False}
    plan = image_plan.plan(d, typed(facts))
    assert plan.nodes["spark3"] == NodeImage(Action.PULL, wanted_id=IMAGE_ID)
    assert plan.nodes["spark2"].action is Action.KEEP


def test_no_node_with_the_image_and_no_pull_leaves_no_reference(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for node in facts.values():
        node["image"] = {"present": False}
    assert image_plan.plan(d, typed(facts)).reference is None


# ---- the rows ----

def judged(d, facts, ask=None):
    plan = hub_plan.plan(d, typed(facts), ask or Hub(), None)
    return {(f.node, f.check): (f.status, f.reason, f.fix)
            for f in evaluate(d, typed(facts), liveness.judge(d, typed(facts)), plan)}


def test_the_rows_of_a_first_download(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    empty(facts, "spark1", "spark2", "spark3")
    rows = judged(d, facts)
    assert rows[("spark1", "hub")] == (
        "warn", f"lab/tiny main is {COMMIT[:12]} (asked the Hub now); up downloads 3 of its 3 files, 8.0 GiB "
                "(8.0 GiB); skips 2 files, 3.0 GiB: README.md (not a file vLLM reads), original/consolidated.00.pth "
                "(excluded (original/*))", "")
    lacks = f"lacks 3 of the 3 files of lab/tiny@{COMMIT[:12]} (config.json, model-00001-of-00002.safetensors, " \
            "model-00002-of-00002.safetensors)"
    assert rows[("spark1", "weights")] == ("warn", f"spark1 {lacks}; up downloads them from the Hub", "")
    assert rows[("spark2", "weights")] == (
        "warn", f"spark2 {lacks}, which spark1 downloads first; will sync from spark1 over the fabric "
                "(spark-vllm:preflight.syncWeights)", "")
    assert rows[("spark3", "space")] == ("ok", "500.0 GiB free at /models, the weights need 8.0 GiB more", "")
    # Before the download, the architecture comes from the Hub's config and the memory from its file sizes.
    assert rows[("spark1", "architecture")] == ("ok", "Qwen3ForCausalLM is supported by vLLM 0.11.0", "")
    assert rows[("spark2", "memory")][1].startswith("needs about 6.7 GiB (weights 2.7 GiB, KV not estimated")
    assert ("spark2", "hub") not in rows  # the row of the node that downloads


def test_the_rows_of_a_no_op(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for node in ("spark1", "spark2", "spark3"):
        with_weights(facts, node, hub=record() if node == "spark1" else None)
    rows = judged(d, facts)
    assert rows[("spark1", "hub")] == (
        "ok", f"lab/tiny main is {COMMIT[:12]} (as the last download recorded it); all its 3 files, 8.0 GiB, are "
              "here; skips 2 files, 3.0 GiB: README.md (not a file vLLM reads), original/consolidated.00.pth "
              "(excluded (original/*))", "")
    assert rows[("spark3", "weights")] == ("ok", f"every file of lab/tiny@{COMMIT[:12]}, 8.0 GiB, in its size", "")
    assert rows[("spark2", "space")] == ("ok", "500.0 GiB free at /models, the weights need 0 B more", "")


@pytest.mark.parametrize("error", [
    "lab/tiny-gated on http://172.29.87.1:18180 is gated and no hfToken is set: accept its terms on the Hub with the "
    "token's account, then set that token (`pulumi config set --secret spark-vllm:hfToken <token>`)",
    "the Hub at http://172.29.87.1:18180 did not answer: ConnectError: [Errno 111] Connection refused",
])
def test_a_hub_that_refuses_fails_the_hub_row(tmp_path, error):
    d, facts = deployment(tmp_path), healthy()
    empty(facts, "spark1")
    rows = judged(d, facts, Hub(HubAnswer(error=error)))
    assert rows[("spark1", "hub")] == ("fail", error, "")
    assert rows[("spark2", "weights")] == ("warn", "could not check: the download's files are unknown (see hub)", "")


def test_a_node_without_room_for_the_download_fails(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    empty(facts, "spark1", "spark2", "spark3")
    facts["spark2"]["space"]["weightsFree"] = 6 * GIB
    assert judged(d, facts)[("spark2", "space")] == (
        "fail", "6.0 GiB free at /models, the weights need 8.0 GiB more",
        "free space on spark2, or put the weights' path on a larger disk")


def test_an_image_without_huggingface_hub_cannot_download(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for node in facts.values():
        node["image"]["inside"]["huggingfaceHub"] = ""
    assert judged(d, facts)[("spark1", "hub")] == (
        "fail", "vllm:a has no huggingface_hub, which the download runs with", "use a vLLM image (they carry it)")


def test_an_image_with_an_old_huggingface_hub_cannot_download_into_a_folder(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    for node in facts.values():
        node["image"]["inside"]["huggingfaceHub"] = "0.20.3"
    assert judged(d, facts)[("spark1", "hub")] == (
        "fail", "vllm:a has huggingface_hub 0.20.3, older than 0.23, whose downloads into a folder write plain files "
                "and keep what they fetched", "use a newer vLLM image")
    for node in facts.values():
        node["image"]["inside"]["huggingfaceHub"] = "0.36.0rc1"
    assert judged(d, facts)[("spark1", "hub")][0] == "warn"  # the download is planned


def test_an_architecture_the_image_lacks_is_refused_from_the_hubs_config_before_the_download(tmp_path):
    d, facts = deployment(tmp_path), healthy()
    empty(facts, "spark1", "spark2", "spark3")
    ask = Hub(HubAnswer(commit=COMMIT, files=tuple(FILES), config={"architectures": ["Qwen3_5MoeForCausalLM"]}))
    assert judged(d, facts, ask)[("spark1", "architecture")] == (
        "fail", "Qwen3_5MoeForCausalLM (from the Hub's config.json, before the download) is not in the registry of "
                "the image's vLLM 0.11.0", "use an image whose vLLM supports Qwen3_5MoeForCausalLM, or another model")


def test_links_to_nothing_fail_as_such(tmp_path):
    d, facts = deployment(tmp_path / "plain"), healthy()
    d = loader.load("test", stack_config(write_catalog(tmp_path / "catalog"), preflight={"enabled": True}), set(), ROOT)
    facts["spark2"]["model"]["dangling"] = [["model-00003-of-00003.safetensors", "../../blobs/abc"]]
    rows = {(f.node, f.check): (f.status, f.reason, f.fix)
            for f in evaluate(d, typed(facts), liveness.judge(d, typed(facts)))}
    assert rows[("spark2", "weights")] == (
        "fail", "1 of the files in /models/big on spark2 are links to nothing: model-00003-of-00003.safetensors -> "
                "../../blobs/abc",
        "put back what they point to (a Hugging Face cache's blobs/), or download the model again")
