"""The artifacts onto every node, by the program (docs/artifacts.md): on the two-node lab, with the real registry
(Debian's docker-registry, with a login) and the real huggingface_hub client against the Hub double, both on the
management LAN (lab/labkit/services.py), through the real engine, with `executor: mp`.

From a lab where neither node holds the stack's image (the registry's tag of the lab's image without Ray) and
neither holds the weights, a stack that names a Hub repo and an image tag comes up: node1 pulls the image, node2
gets node1's copy over the fabric, node1 downloads from the Hub and node2 gets the files over the fabric. The
scenarios run in order on that stack, as an operator's day would.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.request

import pytest

from conftest import LOAD_FLOOR, MP_TURNS, lab_stack, node_sh
from labkit.config import HUB_URL, MP_IMAGE
from labkit.services import hub, push_from_node1, registry
from labstack import chat, planned, steps
from test_preflight import not_ok, rows

MODEL = "/models/hub-tiny"
SHARD = 4194560  # each of the double's four shards, in bytes
SHARD3, SHARD4 = "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"
RANKS = {"vllm-rank-node1-container", "vllm-rank-node2-container", "ranks-ready-node1-gate",
         "ranks-ready-node2-gate", "serve-ready-gate"}
EVERY_RANK = {**{name: "replace" for name in RANKS}, **LOAD_FLOOR, **MP_TURNS}
HF_TOKEN = f"hf_e2e_{secrets.token_hex(12)}"  # granted lab/tiny-gated; every repo reads it
TOKENS = {HF_TOKEN: ["lab/tiny-gated"], "hf_e2e_not_granted": []}


@pytest.fixture(scope="module")
def services(lab2):
    with registry() as reg, hub(TOKENS) as double:
        yield reg, double, push_from_node1(reg, MP_IMAGE)


@pytest.fixture(scope="module")
def art(lab2, services, tmp_path_factory):
    reg, _, ref = services
    # Neither node holds the stack's image, not even under the lab's own tag, nor any of its weights.
    for node in (1, 2):
        node_sh(node, f"rm -rf {MODEL}; docker rmi {ref} >/dev/null 2>&1; docker rmi {MP_IMAGE}")
    config = {"serve.path": MODEL, "serve.image": ref, "serve.hub.repo": "lab/tiny", "serve.hub.endpoint": HUB_URL,
              "images.pull": "head", "images.registryUser": reg.user}
    try:
        for s in lab_stack(tmp_path_factory, lab2, "art", executor="mp", config=config):
            s.set_config("registryPassword", reg.password, secret=True)
            yield s
    finally:
        for node in (1, 2):
            node_sh(node, f"rm -rf {MODEL}", check=False)
        # Each node holds the lab's image again under its own tag (the same id), and neither holds the registry's.
        for node in (1, 2):
            node_sh(node, f"docker image inspect {MP_IMAGE} >/dev/null 2>&1 || docker tag {ref} {MP_IMAGE}",
                    check=False)
        for node in (1, 2):
            node_sh(node, f"docker rmi {ref} >/dev/null 2>&1; true", check=False)


def sums(node: int, path: str = MODEL) -> dict[str, str]:
    out = node_sh(node, f"cd {path} && find . -path ./.cache -prune -o -type f -exec sha256sum {{}} +")
    return {name[2:]: digest for digest, name in (line.split() for line in out.splitlines())}


def image_id(node: int, image: str) -> str:
    return node_sh(node, f"docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null; true").strip()


def served_by_now(double) -> dict[str, int]:
    return {name.split("/", 2)[2]: n for name, n in double.served().items()}


def sizes(revision: str) -> dict[str, int]:
    """Each file of lab/tiny at a revision, with its size in bytes, as the Hub lists them."""
    with urllib.request.urlopen(f"{HUB_URL}/api/models/lab/tiny/revision/{revision}?blobs=true", timeout=10) as r:
        return {s["rfilename"]: s["size"] for s in json.load(r)["siblings"]}


def commit_of(revision: str) -> str:
    """The commit the double serves for a revision, as a client reads it."""
    with urllib.request.urlopen(f"{HUB_URL}/api/models/lab/tiny/revision/{revision}", timeout=10) as r:
        return json.load(r)["sha"]


def shown_nowhere(secret: str, stack, *runs) -> bool:
    """Neither the secret nor its base64 (how the scripts carry it) is in the runs' output or the exported state,
    where Pulumi keeps secrets encrypted."""
    forms = (secret, base64.b64encode(secret.encode()).decode())
    texts = [run.output for run in runs] + [stack.pulumi("stack", "export", check=True).output]
    return not any(form in text for form in forms for text in texts)


def image_size(node: int, image: str) -> str:
    """As preflight prints a size (MiB, one decimal), from the node's own count of bytes."""
    return f"{int(node_sh(node, f'docker image inspect --format {{{{.Size}}}} {image}')) / (1 << 20):.1f} MiB"


def test_a_model_id_and_an_image_tag_come_up_on_nodes_that_hold_neither(art, services):
    reg, double, ref = services
    commit = commit_of("main")
    preview = art.pulumi("preview", check=True)
    found = not_ok(preview)
    # Before the pull, what is inside the image is not known, nor the disk's read speed before there are weights to
    # read: those rows say so.
    unknown = {key for key, (_, reason) in found.items() if reason.startswith("could not check")}
    assert unknown == {(node, check) for node in ("node1", "node2") for check in ("ray+vllm", "architecture",
                                                                                    "loader", "disk")}
    assert {key: value for key, value in found.items() if key not in unknown} == {
        ("node1", "image"): ("warn", f"node1 lacks {ref}; up pulls it from {reg.address} as lab before anything "
                                     "starts here"),
        ("node2", "image"): ("warn", f"node2 lacks {ref}; up copies node1's over the fabric before anything starts "
                                     "here"),
        ("node1", "hub"): ("warn", f"lab/tiny main is {commit[:12]} (asked the Hub now); up downloads 9 of its 9 "
                                   "files, 16.0 MiB (16.0 MiB); skips 3 files, 2.0 MiB: README.md (not a file vLLM "
                                   "reads), original/consolidated.00.pth (excluded (original/*)), tiny.Q8_0.gguf "
                                   "(excluded (*.gguf))"),
        ("node1", "weights"): ("warn", f"node1 lacks 9 of the 9 files of lab/tiny@{commit[:12]} (chat_template.jinja, "
                                       "config.json, generation_config.json and 6 more); up downloads them from the "
                                       "Hub"),
        ("node2", "weights"): ("warn", f"node2 lacks 9 of the 9 files of lab/tiny@{commit[:12]} (chat_template.jinja, "
                                       "config.json, generation_config.json and 6 more), which node1 downloads first; "
                                       "will sync from node1 over the fabric (spark-vllm:preflight.syncWeights)"),
    }
    plan = planned(preview)
    assert {name: plan[name] for name in ("image-transfer-node1", "image-transfer-node2", "weights-download-node1",
                                          "weights-sync-node2")} == dict.fromkeys(
        ["image-transfer-node1", "image-transfer-node2", "weights-download-node1", "weights-sync-node2"], "create")

    # The Hub dies in the middle of the last shard: the files it finished stay, and the next `up` fetches the rest.
    double.control(f"stall?after=1048576&file={SHARD4}")
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("up", art.up(check=False)))
    worker.start()
    # Every other file whole first (the download fetches several at once), so that the stalled shard is the one
    # the Hub dies on.
    size = sizes("main")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        got = served_by_now(double)
        whole = [name for name, n in got.items() if name != SHARD4 and n == size[name]]
        if len(whole) == 8 and got.get(SHARD4, 0) >= 1 << 20:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the download never reached the stalled shard: {served_by_now(double)}")
    double.kill()
    try:
        worker.join(timeout=300)
        failed = result["up"]
        assert failed.returncode != 0
        assert (f"spark-vllm: the download of {SHARD4} failed: the Hub at {HUB_URL} failed while sending {SHARD4}"
                in failed.output), failed.output
        assert not any(name.startswith("vllm-rank") for _, name in steps(failed))  # nothing loads what is not there
        # The image arrived meanwhile: node1 pulled it, node2 got node1's copy over the fabric.
        assert image_id(2, ref) == image_id(1, ref) != ""
        assert f"spark-vllm: pulled {ref} on node1 as " in failed.output
        assert f"spark-vllm: copied {ref} to node2: " in failed.output
    finally:
        double.start()  # the module's other scenarios need the Hub
    up = art.up()
    assert served_by_now(double) == {SHARD4: SHARD}, up.output  # the rest, not the whole model again
    assert "synced 9 files, 16.0 MiB, from node1 to node2" in up.output
    out = art.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    assert out["weights"] == {"repo": "lab/tiny", "commit": commit}
    assert sums(2) == sums(1) and SHARD4 in sums(1) and "original/consolidated.00.pth" not in sums(1)
    assert node_sh(2, f"find {MODEL} -type l").strip() == ""

    # A plain preview is clean and asks the Hub nothing; a second `up` changes nothing.
    double.control("reset")
    again = art.pulumi("preview", "--expect-no-changes", check=True)
    assert planned(again) == {} and double.api_calls() == [], double.stats()
    assert rows(again)[("node1", "hub")][0] == "ok" and rows(again)[("node2", "image")][0] == "ok"
    assert planned(art.up("--expect-no-changes")) == {}
    assert shown_nowhere(reg.password, art, failed, up, again)


def test_a_new_revision_fetches_the_one_changed_file_and_restarts_every_rank(art, services):
    _, double, _ = services
    commit = commit_of("v2")
    double.control("reset")
    art.set_config("serve.hub.revision", "v2")
    preview = art.pulumi("preview", check=True)
    assert planned(preview) == {**EVERY_RANK, "weights-download-node1": "replace", "weights-sync-node2": "replace"}
    assert rows(preview)[("node1", "hub")][1].startswith(f"lab/tiny v2 is {commit[:12]} (asked the Hub now); up "
                                                         "downloads 1 of its 9 files, 16.0 MiB (4.0 MiB)")
    up = art.up()
    assert served_by_now(double) == {SHARD3: SHARD}
    assert "synced 1 file, 4.0 MiB, from node1 to node2" in up.output
    out = art.outputs()
    assert out["weights"]["commit"] == commit and sums(2) == sums(1)
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"


def test_the_hub_dying_during_a_change_leaves_the_running_model_serving(art, services):
    _, double, _ = services
    before = {node: node_sh(node, "docker ps -q --filter label=spark-vllm.stack=art").split() for node in (1, 2)}
    double.control("reset")
    double.control(f"stall?after=1048576&file={SHARD3}")
    art.set_config("serve.hub.revision", "main")
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("up", art.up(check=False)))
    worker.start()
    deadline = time.monotonic() + 300
    while served_by_now(double).get(SHARD3, 0) < 1 << 20 and time.monotonic() < deadline:
        time.sleep(0.2)
    double.kill()
    worker.join(timeout=300)
    assert result["up"].returncode != 0 and f"the download of {SHARD3} failed" in result["up"].output
    out = art.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
    assert {node: node_sh(node, "docker ps -q --filter label=spark-vllm.stack=art").split()
            for node in (1, 2)} == before
    double.start()
    art.up()
    assert served_by_now(double) == {SHARD3: SHARD}
    assert art.outputs()["weights"]["commit"] == commit_of("main")


def test_a_lost_file_and_a_removed_image_are_seen_by_a_plain_preview_and_repaired(art, services):
    _, double, ref = services
    node_sh(2, f"rm {MODEL}/{SHARD3}")
    preview = art.pulumi("preview", check=True)
    assert planned(preview) == {"weights-sync-node2": "replace"}
    assert not_ok(preview)[("node2", "weights")][1].startswith("node2 lacks 1 of the 9 files of lab/tiny@")
    art.up()
    assert sums(2) == sums(1)

    # Untagged by hand while its rank runs: Docker keeps the build for the container, under no name.
    held = image_id(2, ref)
    node_sh(2, f"docker rmi -f {ref}")
    preview = art.pulumi("preview", check=True)
    assert planned(preview) == {"image-transfer-node2": "replace", "node2-image": "replace"}
    assert not_ok(preview)[("node2", "image")] == (
        "warn", f"node2 lacks {ref}; up copies node1's ({held[7:19]}, {image_size(1, ref)}) over the fabric before "
                "anything starts here")
    up = art.up()
    assert f"node2 held {held[:19]} under another name: tagged it {ref}, nothing copied" in up.output
    assert image_id(2, ref) == held
    assert not any(name.startswith("vllm-rank") for _, name in steps(up) if _ != "same")
    art.pulumi("preview", "--expect-no-changes", check=True)


# A revision the node's record does not hold is asked of the Hub, with the stack's token: that is where a token fails.
@pytest.mark.parametrize("repo,revision,token,reason", [
    ("lab/tiny-gated", "main", None,
     "lab/tiny-gated on {url} is gated and no hfToken is set: accept its terms on the Hub with the token's account, "
     "then set that token (`pulumi config set --secret spark-vllm:hfToken <token>`)"),
    ("lab/tiny-gated", "main", "hf_e2e_not_granted",
     "lab/tiny-gated on {url} is gated and the stack's hfToken's account has not been granted access: accept its "
     "terms on the Hub with the token's account, then set that token (`pulumi config set --secret "
     "spark-vllm:hfToken <token>`)"),
    ("lab/tiny", "v2", "hf_e2e_wrong",
     "the Hub at {url} refused the stack's hfToken as not valid (401): set a current one (`pulumi config set "
     "--secret spark-vllm:hfToken <token>`)"),
])
def test_a_gated_repo_and_a_wrong_token_fail_at_preflight_with_nothing_restarted(art, services, repo, revision,
                                                                                 token, reason):
    before = {node: node_sh(node, "docker ps -q --filter label=spark-vllm.stack=art").split() for node in (1, 2)}
    art.set_configs({"serve.hub.repo": repo, "serve.hub.revision": revision})
    if token:
        art.set_config("hfToken", token, secret=True)
    try:
        up = art.up(check=False)
        assert up.returncode != 0 and "nothing was deployed or changed" in up.output
        assert not_ok(up)[("node1", "hub")] == ("FAIL", reason.format(url=HUB_URL))
        assert steps(up) == [] or all(op == "same" for op, _ in steps(up))
        assert {node: node_sh(node, "docker ps -q --filter label=spark-vllm.stack=art").split()
                for node in (1, 2)} == before
        if token:
            assert shown_nowhere(token, art, up)
    finally:
        art.set_configs({"serve.hub.repo": "lab/tiny", "serve.hub.revision": "main"})
        if token:
            art.pulumi("config", "rm", "spark-vllm:hfToken", check=True)


def test_a_granted_token_reads_a_gated_repo_and_stays_secret(art, services):
    _, double, _ = services
    art.set_config("serve.hub.repo", "lab/tiny-gated")
    art.set_config("hfToken", HF_TOKEN, secret=True)
    try:
        up = art.up()
        assert "lab/tiny-gated" in art.outputs()["weights"]["repo"]
        assert shown_nowhere(HF_TOKEN, art, up)
    finally:
        art.set_config("serve.hub.repo", "lab/tiny")
