"""The weights sync on the lab, through the real engine: a worker that lacks a shard gets it from the head over the
fabric, before its Ray container starts; then a no-op preview has no changes.

The scenario works on its own copy of the lab's model, /models/ws-tiny on both nodes, removed at the end, so the
shipped /models/lab-tiny stays untouched.
"""

from __future__ import annotations

import re

import pytest

from conftest import lab_stack, node_sh
from labstack import planned, steps
from test_preflight import not_ok, rows

MODEL = "/models/ws-tiny"
SHARD1, SHARD3 = "model-00001-of-00004.safetensors", "model-00003-of-00004.safetensors"
SYNC = "will sync from node1 over the fabric (spark-vllm:preflight.syncWeights)"
START = f"spark-vllm: syncing node1:{MODEL}/ to node2 (10.87.200.12) over the fabric; files compared by size"


def sums(node: int) -> dict[str, str]:
    out = node_sh(node, f"cd {MODEL} && sha256sum *")
    return {name: digest for digest, name in (line.split() for line in out.splitlines())}


def synced(run, files: int, mib: float) -> re.Match:
    plural = "s" if files != 1 else ""
    match = re.search(rf"spark-vllm: synced {files} file{plural}, {mib:.1f} MiB, from node1 to node2 in "
                      r"([\d.]+) s: ([\d.]+) GB/s", run.output)
    assert match, run.output
    return match


@pytest.fixture(scope="module")
def ws(lab2, tmp_path_factory):
    for node in (1, 2):
        node_sh(node, f"rm -rf {MODEL} && cp -a /models/lab-tiny {MODEL}")
    try:
        for s in lab_stack(tmp_path_factory, lab2, "ws", config={"serve.path": MODEL}):
            s.pulumi("config", "set", "--path", "--type", "bool", "spark-vllm:preflight.syncWeights", "true",
                     check=True)
            yield s
    finally:
        for node in (1, 2):
            node_sh(node, f"rm -rf {MODEL}", check=False)


def test_a_missing_and_a_shorter_shard_are_synced_before_the_worker_starts(ws):
    node_sh(2, f"rm {MODEL}/{SHARD3} && truncate -s 1000 {MODEL}/{SHARD1}")
    preview = ws.pulumi("preview", check=True)
    assert not_ok(preview) == {("node2", "weights"): (
        "warn", f"node2 lacks {SHARD3}; node2's {SHARD1} is 1000 B, node1's is 4.0 MiB; {SYNC}")}
    assert "0 failed, 1 warnings" in preview.output
    assert planned(preview)["weights-sync-node2"] == "create"

    up = ws.up()
    assert START in up.output, up.output
    for shard in (SHARD1, SHARD3):
        assert f"spark-vllm: copying {shard} (4.0 MiB)" in up.output
    assert re.search(r"spark-vllm: [\d.]+ MiB copied, [12] files? done, at [\d.]+[kMG]B/s, \d+:\d\d:\d\d elapsed",
                     up.output), up.output
    synced(up, 2, 8.0)
    order = [name for op, name in steps(up) if op == "create"]
    assert order.index("weights-sync-node2") < order.index("ray-worker-node2-container")
    assert sums(2) == sums(1)
    # The key went to a private temp folder on node1 that is gone.
    assert node_sh(1, "find /tmp -path '/tmp/tmp.*' -name key").strip() == ""

    again = ws.pulumi("preview", "--expect-no-changes", check=True)
    assert planned(again) == {} and not_ok(again) == {}
    assert rows(again)[("node2", "weights")] == (
        "ok", "4 weight files, 16.0 MiB, the same names and sizes as node1 "
              "(contents not hashed: spark-vllm:preflight.hashWeights is off)")


def test_the_same_shard_lost_again_is_synced_again_and_nothing_else_restarts(ws):
    before = ws.outputs()
    node_sh(2, f"rm {MODEL}/{SHARD3}")
    preview = ws.pulumi("preview", check=True)
    assert planned(preview) == {"weights-sync-node2": "replace"}
    assert not_ok(preview) == {("node2", "weights"): ("warn", f"node2 lacks {SHARD3}; {SYNC}")}
    up = ws.up()
    synced(up, 1, 4.0)
    assert [(op, name) for op, name in steps(up) if op != "same"] == [
        ("create-replacement", "weights-sync-node2"), ("replace", "weights-sync-node2"),
        ("delete-replaced", "weights-sync-node2")], steps(up)
    assert ws.outputs() == before
    assert sums(2) == sums(1)
    ws.pulumi("preview", "--expect-no-changes", check=True)
