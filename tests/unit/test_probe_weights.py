"""What the probe reads of the weights on a node: a Hugging Face cache snapshot's links followed to their bytes, links
to nothing named, the folder a container must mount, the Hub download's record, and the free space."""

from __future__ import annotations

import json
import os
from pathlib import Path

from components.nodes.node_facts import parse
from test_preflight_checks import load_probe


def cache_snapshot(root: Path, commit: str = "abc123") -> Path:
    """A snapshot as huggingface_hub lays it out without local_dir: files linked to ../../blobs/<etag>."""
    repo = root / "models--lab--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / commit
    (snapshot / "sub").mkdir(parents=True)
    for name, etag, data in (("config.json", "e1", b"{}"), ("model.safetensors", "e2", b"x" * 5000),
                             ("sub/tokenizer.json", "e3", b"t" * 7)):
        (repo / "blobs" / etag).write_bytes(data)
        depth = "../" * (name.count("/") + 2)
        os.symlink(f"{depth}blobs/{etag}", snapshot / name)
    return snapshot


def test_a_cache_snapshot_counts_its_blobs_bytes_and_mounts_the_repo_folder(tmp_path):
    snapshot = cache_snapshot(tmp_path)
    facts = load_probe().model({"modelPath": str(snapshot), "hashWeights": True})
    assert facts["files"] == [["config.json", 2], ["model.safetensors", 5000], ["sub/tokenizer.json", 7]]
    assert facts["links"] == 3 and facts["dangling"] == []
    assert facts["mountRoot"] == str(tmp_path / "models--lab--tiny")
    assert list(facts["sha256"]) == ["model.safetensors"]
    model = parse({"model": facts}).model
    assert model.mount_root == str(tmp_path / "models--lab--tiny") and model.links == 3


def test_a_link_to_nothing_is_named_not_a_crash(tmp_path):
    snapshot = cache_snapshot(tmp_path)
    (tmp_path / "models--lab--tiny/blobs/e2").unlink()
    facts = load_probe().model({"modelPath": str(snapshot), "hashWeights": False})
    assert facts["dangling"] == [["model.safetensors", "../../blobs/e2"]]
    assert [name for name, _ in facts["files"]] == ["config.json", "sub/tokenizer.json"]


def test_a_plain_folder_mounts_itself_and_reads_the_downloads_record(tmp_path):
    folder = tmp_path / "model"
    (folder / ".cache/spark-vllm").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    record = {"repo": "lab/tiny", "revision": "main", "commit": "c" * 40, "complete": True, "fetch": ["config.json"],
              "files": [["config.json", 2, "e1"]]}
    (folder / ".cache/spark-vllm/hub.json").write_text(json.dumps(record))
    facts = load_probe().model({"modelPath": str(folder), "hashWeights": False,
                                "hubRecord": str(folder / ".cache/spark-vllm/hub.json")})
    assert facts["files"] == [["config.json", 2]] and facts["mountRoot"] == str(folder) and facts["links"] == 0
    assert facts["hub"] == {k: record[k] for k in ("repo", "revision", "commit", "files", "complete")}
    hub = parse({"model": facts}).model.hub
    assert hub is not None and hub.commit == "c" * 40 and hub.files == (("config.json", 2, "e1"),) and hub.complete
    (folder / ".cache/spark-vllm/hub.json").write_text("{not json")
    assert "hub" not in load_probe().model({"modelPath": str(folder), "hashWeights": False,
                                            "hubRecord": str(folder / ".cache/spark-vllm/hub.json")})


def test_free_space_is_read_at_the_nearest_folder_that_exists(tmp_path):
    space = load_probe().space({"modelPath": str(tmp_path / "not/yet/there")}, str(tmp_path))
    st = os.statvfs(tmp_path)
    assert space["weightsMount"] == str(tmp_path) and space["dockerRoot"] == str(tmp_path)
    assert abs(space["weightsFree"] - st.f_bavail * st.f_frsize) < 1 << 30
    assert parse({"space": space}).space.weights_mount == str(tmp_path)
