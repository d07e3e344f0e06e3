"""The weights from the Hub with Ray, on the lab, through the real engine (the mp scenarios are test_artifacts.py).

Links never ship empty: a head whose weights are a Hugging Face cache snapshot (every file a link into ../../blobs,
as huggingface_hub lays out a download without local_dir). The snapshot is made on node1 by the real huggingface_hub
client, in the lab's image, from the Hub double. node2 has nothing. The sync must give node2 the bytes, not the
links, and check it; the head's container must see what its links point to. Then the same stack takes its weights
from the Hub itself, and a new revision restarts the serve alone.
"""

from __future__ import annotations

import pytest

from conftest import SERVE_CHAIN, lab_stack, node_sh
from labkit.config import HUB_URL, INNER_IMAGE
from labkit.services import hub
from labstack import chat, planned
from test_preflight import not_ok, rows

CACHE = "/models/hf-cache"
REPO_FOLDER = f"{CACHE}/models--lab--tiny"
FROM_HUB = "/models/hub-ray"


@pytest.fixture(scope="module")
def double(lab2):
    with hub({}) as running:
        yield running


@pytest.fixture(scope="module")
def snapshot(double):
    """The snapshot's path on node1, made with the real client; node2 has no such folder."""
    for node in (1, 2):
        node_sh(node, f"rm -rf {CACHE} {FROM_HUB}")
    program = (f"from huggingface_hub import snapshot_download; print(snapshot_download('lab/tiny', "
               f"cache_dir='{CACHE}', endpoint='{HUB_URL}', allow_patterns=['*.json', '*.safetensors']))")
    path = node_sh(1, f"docker run --rm --network host -e HF_HUB_DISABLE_TELEMETRY=1 -v {CACHE}:{CACHE} "
                      f"--entrypoint python3 {INNER_IMAGE} -c \"{program}\"").strip().splitlines()[-1]
    try:
        yield path
    finally:
        for node in (1, 2):
            node_sh(node, f"rm -rf {CACHE} {FROM_HUB}", check=False)


@pytest.fixture(scope="module")
def cache_stack(lab2, snapshot, tmp_path_factory):
    s = None
    for s in lab_stack(tmp_path_factory, lab2, "hfc", config={"serve.path": snapshot}):
        s.pulumi("config", "set", "--path", "--type", "bool", "spark-vllm:preflight.syncWeights", "true", check=True)
        yield s


def test_the_worker_gets_the_bytes_the_links_point_to_and_the_head_sees_them(cache_stack, snapshot):
    links = node_sh(1, f"find {snapshot} -type l | wc -l").strip()
    assert int(links) == 8 and node_sh(1, f"find {snapshot} -type f | wc -l").strip() == "0"
    preview = cache_stack.pulumi("preview", check=True)
    assert rows(preview)[("node1", "weights")][0] == "ok"
    assert not_ok(preview)[("node2", "weights")] == (
        "warn", f"{snapshot} is not there on node2; will sync from node1 over the fabric "
                "(spark-vllm:preflight.syncWeights)")
    up = cache_stack.up()
    # Eight files with their bytes (four 4 MiB shards and four small JSON files), not eight links of a few bytes.
    assert "spark-vllm: synced 8 files, 16.0 MiB, from node1 to node2" in up.output, up.output
    assert node_sh(2, f"find {snapshot} -type l").strip() == ""
    theirs = node_sh(2, f"cd {snapshot} && sha256sum *")
    assert theirs == node_sh(1, f"cd {snapshot} && sha256sum *")  # through node1's links, the same bytes
    head = node_sh(1, "docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' spark-vllm-hfc-ray-head").split()
    assert REPO_FOLDER in head and snapshot not in head
    worker = node_sh(2, "docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' spark-vllm-hfc-ray-worker").split()
    assert snapshot in worker
    out = cache_stack.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    assert planned(cache_stack.pulumi("preview", "--expect-no-changes", check=True)) == {}


def test_a_link_to_nothing_is_named_before_anything_changes(cache_stack, snapshot):
    blob = node_sh(1, f"readlink {snapshot}/model-00002-of-00004.safetensors").strip()
    node_sh(1, f"mv {snapshot}/{blob} /tmp/held-blob")
    try:
        preview = cache_stack.pulumi("preview")
        assert preview.returncode != 0 and "nothing was deployed or changed" in preview.output
        assert not_ok(preview)[("node1", "weights")] == (
            "FAIL", f"1 of the files in {snapshot} on node1 are links to nothing: model-00002-of-00004.safetensors -> "
                    f"{blob}. Fix: put back what they point to (a Hugging Face cache's blobs/), or download the model "
                    "again")
    finally:
        node_sh(1, f"mv /tmp/held-blob {snapshot}/{blob}")
    assert planned(cache_stack.pulumi("preview", "--expect-no-changes", check=True)) == {}


def test_with_ray_the_hub_download_reaches_every_node_and_a_new_revision_restarts_the_serve_alone(cache_stack,
                                                                                               double):
    cache_stack.set_configs({"serve.path": FROM_HUB, "serve.hub.repo": "lab/tiny", "serve.hub.endpoint": HUB_URL})
    up = cache_stack.up()
    assert "spark-vllm: downloaded lab/tiny@" in up.output and "spark-vllm: synced 9 files, 16.0 MiB" in up.output
    out = cache_stack.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    double.control("reset")
    cache_stack.set_config("serve.hub.revision", "v2")
    preview = cache_stack.pulumi("preview", check=True)
    # New weights load into the same Ray cluster: the serve restarts, the containers do not.
    assert planned(preview) == {**SERVE_CHAIN, "weights-download-node1": "replace", "weights-sync-node2": "replace"}
    up = cache_stack.up()
    assert list(double.served()) == ["lab/tiny/model-00003-of-00004.safetensors"]
    assert "spark-vllm: synced 1 file, 4.0 MiB" in up.output
    out = cache_stack.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    assert planned(cache_stack.pulumi("preview", "--expect-no-changes", check=True)) == {}
