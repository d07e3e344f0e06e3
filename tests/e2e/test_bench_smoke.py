"""Keeps the benchmarks working: bench/run at one repetition (CI's setting), with Ray at N=2 and with `executor: mp`
at N=2 and N=8, bench/loaders and bench/artifacts at their smallest. They check the reports' shape and what was
deployed, never a timing. The eight-node scenario (mp deploys a rank on every node, one dead worker is repaired,
destroy leaves nothing) runs here, in CI, as part of the bench's own run."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import ROOT

FIGURES = {"noop_preview", "noop_up", "serve_change", "cold_start", "seed_sleep", "scaling", "breakdown", "mp"}
STAT = {"median", "min", "max", "samples"}


def test_bench_quick_prints_the_table_and_writes_json(lab2, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([str(ROOT / "bench" / "run"), "--reps", "1", "--nodes", "2,8", "--ray-nodes", "2", "--quick",
                           "--out", str(out)], env={**os.environ, **lab2}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| # | figure | spark-vllm | baseline or floor | ratio | goal |" in done.stdout
    assert "| step | start | end | took |" in done.stdout

    result = json.loads(out.read_text())
    f = result["figures"]
    assert set(f) == FIGURES
    for stat in (f["noop_preview"]["spark_vllm_s"], f["noop_preview"]["empty_program_s"], f["noop_preview"]["ratio"],
                 f["noop_up"]["spark_vllm_s"], f["serve_change"]["ratio"], f["cold_start"]["ratio"],
                 f["scaling"]["2"]["up_s"], f["breakdown"]["floors"]["ray_join_s"],
                 f["mp"]["cold_start"]["ratio"], f["mp"]["cold_start"]["vs_ray_ratio"],
                 f["mp"]["serve_change"]["ratio"], f["mp"]["scaling"]["2"]["up_s"], f["scaling"]["2"]["up_cpu_s"],
                 f["mp"]["scaling"]["2"]["up_cpu_s"], f["mp"]["scaling"]["2"]["preview_s"],
                 f["mp"]["scaling"]["2"]["repair_s"], f["mp"]["scaling"]["2"]["repair_cpu_s"],
                 f["noop_preview"]["providers_floor_s"], f["noop_preview"]["providers_ratio"],
                 f["mp"]["scaling"]["8"]["engine_floor_preview_s"],
                 f["mp"]["scaling"]["8"]["preview_ratio_vs_engine_floor"]):
        assert set(stat) == STAT and len(stat["samples"]) >= 1
    # What the figures stand for, not how fast: spark-vllm restarts no container on a serve-only change, the
    # seed restarts all of them, and the seed deployed exactly what spark-vllm deploys.
    assert f["serve_change"]["containers_restarted"] == {"spark_vllm": [0], "seed": [2]}
    assert f["mp"]["serve_change"]["containers_restarted"] == [2]  # every rank: one torch.distributed group
    assert "… with `executor: mp` (no Ray) → `/v1/models` answers" in done.stdout
    assert result["parity"] == "identical"
    assert f["seed_sleep"]["runs"] == 2 and 0 <= f["seed_sleep"]["too_short"] <= 2
    assert set(f["seed_sleep"]["sleeps_s"]) <= {5, 10, 20} and f["seed_sleep"]["sleeps_s"]  # doubled on a retry
    steps = {s["name"] for s in f["breakdown"]["steps"]}
    assert {"ray-head-container", "cluster-ready-gate", "vllm-serve-process", "serve-ready-gate"} <= steps
    mp_steps = {s["name"] for s in f["mp"]["steps"]}
    assert {"vllm-rank-node1-container", "vllm-rank-node2-container", "ranks-ready-node2-gate",
            "serve-ready-gate"} <= mp_steps
    assert "Up from empty with `executor: mp` by cluster size" in done.stdout
    # Eight nodes with mp: a rank on each after up and after one dead worker's repair, nothing left after destroy.
    for n in (2, 8):
        mp = f["mp"]["scaling"][str(n)]
        assert (mp["ranks_after_up"], mp["ranks_after_repair"], mp["containers_left_after_destroy"]) == ([n], [n], [0])
    assert set(f["scaling"]) == {"2"}  # Ray only up to --ray-nodes
    # Every node adds its own resources (a provider, an image, a rank, its gates...) to the engine's count.
    per_node = (f["mp"]["scaling"]["8"]["resources"] - f["mp"]["scaling"]["2"]["resources"]) / 6
    assert per_node == int(per_node) and per_node >= 5, f["mp"]["scaling"]
    for key in ("up", "preview", "repair"):
        assert set(f["mp"]["scaling"]["8"][f"{key}_ratio_vs_2"]) == STAT
    assert "mp at N=8: rank containers after up 8, after the repair 8; spark-vllm containers left after destroy 0" \
        in done.stdout


def test_bench_loaders_prints_each_format_against_the_floor(lab2, tmp_path):
    """bench/loaders at its smallest: 1 GiB, one repetition, the default loader and InstantTensor."""
    out = tmp_path / "loaders.json"
    done = subprocess.run([str(ROOT / "bench" / "loaders"), "--gib", "1", "--reps", "1", "--formats",
                           "auto,instanttensor", "--out", str(out)],
                          env={**os.environ, **lab2}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| loadFormat | load (s) | floor (s) | load / floor |" in done.stdout
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| `")]
    assert rows == ["`auto`", "`instanttensor`"], done.stdout
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == {"auto", "instanttensor"}
    for f in figures.values():
        assert len(f["seconds"]) == len(f["floorSeconds"]) == len(f["ratio"]) == 1 and f["floorSeconds"][0] > 0


def test_bench_artifacts_prints_each_step_against_its_floor(lab2, tmp_path):
    """bench/artifacts at its smallest: 0.05 GiB in 4 MiB shards (13 of them), one repetition."""
    out = tmp_path / "artifacts.json"
    done = subprocess.run([str(ROOT / "bench" / "artifacts"), "--gib", "0.05", "--shard-mib", "4", "--reps", "1",
                           "--out", str(out)], env={**os.environ, **lab2}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| step | seconds | floor (s) | ÷ floor |" in done.stdout
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in
            line][1:]
    assert rows == ["download (node1 from the Hub)", "sync (node1 to node2)", "download + distribution"], done.stdout
    assert "Image copy node1 → node2" in done.stdout and "of the fabric's" in done.stdout
    result = json.loads(out.read_text())
    assert set(result["floors"]) == {"hub", "disk node1", "disk node2", "fabric"}
    run = result["runs"][0]
    assert 13 * 4194560 < run["bytes"] < 13 * 4194560 + (64 << 10)  # the shards, and the few small files fetched
    assert {"download_s", "sync_s", "copy_s", "copy_bytes", "up_s"} <= set(run)

