"""`vllm serve --distributed-executor-backend ray` against a real local Ray head with 2 GPUs.

Skipped when the test interpreter has no `ray`; see lab/vllm_double/README.md to run them.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from vllm_double_support import (RAY, RAY_NODE_IP, double_env, free_port, http, ray_env,
                                 ray_skip_reason, wait_gpus_free)


@pytest.fixture
def head(ray_head):
    wait_gpus_free(ray_head)
    return ray_head


def test_tp2_places_both_workers_and_serves(head, start_double, tiny_model):
    double = start_double([str(tiny_model), "-tp", "2", *RAY, "--served-model-name", "lab-tiny"],
                          **ray_env(head))
    double.wait_ready(timeout=90)
    # Ray forwards worker output asynchronously and folds look-alike lines of several workers.
    worker_line = re.compile(r"\(RayWorkerWrapper pid=\d+[^)]*\)\S* INFO .* rank \d in world size 2 is "
                             r"assigned as DP rank 0, PP rank 0, TP rank \d")
    deadline = time.time() + 15
    while not worker_line.search(double.log()) and time.time() < deadline:
        time.sleep(0.2)
    log = double.log()
    assert worker_line.search(log), log
    assert f"Driver node: {RAY_NODE_IP}" in log
    assert f"Ray workers placed: rank 0 on {RAY_NODE_IP}, rank 1 on {RAY_NODE_IP}" in log
    progress = re.findall(r"Loading safetensors checkpoint shards: +\d+% Completed \| (\d)/4", log)
    assert sorted(set(progress)) == ["0", "1", "2", "3", "4"]
    assert "Loading weights took" in log
    status, body = http(double.url + "/v1/chat/completions", "POST",
                        {"model": "lab-tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["choices"][0]["message"]["content"] == "[lab-tiny] hi"
    assert double.stop() == 0


def test_wrong_vllm_host_ip_fails_fast_naming_both(head, run_double, tiny_model):
    started = time.monotonic()
    result = run_double(["serve", str(tiny_model), "--port", "0", "-tp", "2", *RAY],
                        timeout=60, **ray_env(head, VLLM_HOST_IP="127.0.0.9"))
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stdout
    assert (f"VLLM_HOST_IP 127.0.0.9 is not the IP address of any alive Ray node; the Ray node "
            f"IPs are ['{RAY_NODE_IP}']") in result.stdout
    assert "Loading safetensors checkpoint shards" not in result.stdout


def test_too_many_gpus_fails_after_the_bounded_wait(head, run_double, tiny_model):
    started = time.monotonic()
    result = run_double(["serve", str(tiny_model), "--port", "0", "-tp", "3", *RAY], timeout=60,
                        **ray_env(head, VLLM_DOUBLE_PG_TIMEOUT_S="5"))
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout
    assert 5 <= elapsed < 40
    assert "Waiting for creating a placement group of specs for" in result.stdout
    assert "Cannot provide a placement group requiring 3 GPUs" in result.stdout
    assert "within 5 seconds" in result.stdout
    assert f"Available resources per node IP: {{'{RAY_NODE_IP}': {{" in result.stdout
    assert "Loading safetensors checkpoint shards" not in result.stdout


def test_driver_node_without_a_free_gpu_fails(head, run_double, tiny_model):
    """Another job holds both GPUs: vLLM refuses before creating its placement group."""
    holder_code = ("import sys, ray; ray.init(address='auto', logging_level='ERROR'); "
                   "pg = ray.util.placement_group([{'GPU': 2}]); ray.get(pg.ready(), timeout=30); "
                   "print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", holder_code], env=double_env(**ray_env(head)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = run_double(["serve", str(tiny_model), "--port", "0", *RAY], timeout=60,
                            **ray_env(head))
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert result.returncode == 1, result.stdout
    assert "Current node has no GPU available." in result.stdout
    assert f"current_ip='{RAY_NODE_IP}'" in result.stdout


def test_missing_model_fails_before_touching_ray(head, run_double, tmp_path):
    result = run_double(["serve", str(tmp_path / "gone"), "--port", "0", "-tp", "2", *RAY],
                        timeout=60, **ray_env(head))
    assert result.returncode == 1
    assert f"Invalid repository ID or local directory specified: '{tmp_path / 'gone'}'" in result.stdout
    assert "Connecting to existing Ray cluster" not in result.stdout


def test_exits_nonzero_when_a_worker_dies(head, start_double, tiny_model):
    double = start_double([str(tiny_model), "-tp", "2", *RAY],
                          **ray_env(head, VLLM_HOST_IP=RAY_NODE_IP))
    double.wait_ready(timeout=90)
    workers = []
    for pid in head.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if handle.read().startswith(b"ray::RayWorkerWrapper"):
                    workers.append(pid)
        except OSError:
            continue
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    assert double.wait_exit(timeout=60) == 1
    assert "Lost a Ray worker of the engine" in double.log()


def test_unreachable_ray_cluster_fails_within_the_bound(run_double, tiny_model):
    reason = ray_skip_reason()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    result = run_double(["serve", str(tiny_model), "--port", "0", *RAY], timeout=60,
                        RAY_ADDRESS=f"{RAY_NODE_IP}:{free_port()}", VLLM_DOUBLE_RAY_INIT_TIMEOUT_S="5")
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert "Connecting to the Ray cluster (ray.init) did not finish within 5 seconds" in result.stdout
