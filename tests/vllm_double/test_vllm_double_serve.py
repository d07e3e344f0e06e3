"""`vllm serve` without Ray (TP=1): model checks, shard loading progress and the HTTP API."""

import re
import socket
import time

import pytest
from vllm_double_support import Double, http, write_model

API_KEY = "lab-secret"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One double serving a 4-shard model with an API key from VLLM_API_KEY (as spark-vllm sets it)."""
    root = tmp_path_factory.mktemp("served")
    model = write_model(root / "lab-tiny")
    double = Double([str(model), "--served-model-name", "lab-tiny", "--max-model-len", "64"],
                    root / "double.log", VLLM_API_KEY=API_KEY, VLLM_DOUBLE_SHARD_DELAY_S="0.2")
    try:
        started = time.monotonic()
        double.wait_ready(timeout=60)
        double.ready_after = time.monotonic() - started
        double.model = model
        yield double
    finally:
        double.stop()


def test_progress_lines_count_every_shard_in_order(served):
    log = served.log()
    progress = re.findall(
        r"^Loading safetensors checkpoint shards: +(\d+)% Completed \| (\d+)/(\d+) "
        r"\[\d\d:\d\d<(?:\d\d:\d\d|\?), +(?:[\d.]+it/s|[\d.]+s/it|\?it/s)\]$", log, re.M)
    assert [(int(done), int(total)) for _, done, total in progress] == [
        (0, 4), (1, 4), (2, 4), (3, 4), (4, 4), (4, 4)]
    assert [int(pct) for pct, _, _ in progress] == [0, 25, 50, 75, 100, 100]
    took = re.search(r"^INFO \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] Loading weights took ([\d.]+) seconds$",
                     log, re.M)
    assert took and float(took.group(1)) >= 4 * 0.2  # the per-shard delay is honoured
    assert served.ready_after >= 4 * 0.2


def test_startup_lines_come_in_vllm_order(served):
    log = served.log()
    markers = ["non-default args:", "Resolved architecture: Qwen3ForCausalLM",
               "Loading safetensors checkpoint shards:   0% Completed | 0/4",
               "Loading weights took", "Starting vLLM API server 0 on http://127.0.0.1:",
               "INFO:     Application startup complete."]
    positions = [log.index(marker) for marker in markers]
    assert positions == sorted(positions)


def test_health_needs_no_key(served):
    assert http(served.url + "/health") == (200, None)


def test_v1_needs_the_key(served):
    assert http(served.url + "/v1/models") == (401, {"error": "Unauthorized"})
    assert http(served.url + "/v1/models", token="wrong")[0] == 401
    status, _ = http(served.url + "/v1/chat/completions", "POST",
                     {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 401


def test_models_lists_served_name_with_model_path_as_root(served):
    status, body = http(served.url + "/v1/models", token=API_KEY)
    assert status == 200
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == "lab-tiny"
    assert card["root"] == str(served.model)
    assert card["max_model_len"] == 64
    assert card["owned_by"] == "vllm"


def test_chat_completion_is_deterministic_and_openai_shaped(served):
    request = {"model": "lab-tiny", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ping from the lab"}], "max_tokens": 16}
    status, first = http(served.url + "/v1/chat/completions", "POST", request, token=API_KEY)
    assert status == 200
    _, second = http(served.url + "/v1/chat/completions", "POST", request, token=API_KEY)
    assert first["id"] == second["id"] and first["id"].startswith("chatcmpl-")
    assert first["object"] == "chat.completion" and first["model"] == "lab-tiny"
    [choice] = first["choices"]
    assert choice["message"] == second["choices"][0]["message"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "[lab-tiny] ping from the lab"
    assert choice["finish_reason"] == "stop"
    assert first["usage"] == {"prompt_tokens": 6, "completion_tokens": 5, "total_tokens": 11}

    other = dict(request, messages=[{"role": "user", "content": "something else"}])
    _, third = http(served.url + "/v1/chat/completions", "POST", other, token=API_KEY)
    assert third["id"] != first["id"]
    assert third["choices"][0]["message"]["content"] == "[lab-tiny] something else"


def test_chat_completion_truncates_at_max_tokens(served):
    request = {"messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 2}
    status, body = http(served.url + "/v1/chat/completions", "POST", request, token=API_KEY)
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "[lab-tiny] one"
    assert body["choices"][0]["finish_reason"] == "length"


def test_chat_completion_errors(served):
    url = served.url + "/v1/chat/completions"
    status, body = http(url, "POST", {"model": "other", "messages": [{"role": "user", "content": "x"}]},
                        token=API_KEY)
    assert status == 404
    assert body["error"]["message"] == "The model `other` does not exist."
    status, body = http(url, "POST", {"messages": []}, token=API_KEY)
    assert status == 400
    status, body = http(url, "POST", {"messages": [{"role": "user", "content": "x"}],
                                      "max_tokens": 100}, token=API_KEY)
    assert status == 400
    assert "maximum context length is 64 tokens" in body["error"]["message"]


def test_unknown_route_and_wrong_method(served):
    assert http(served.url + "/nope") == (404, {"detail": "Not Found"})
    assert http(served.url + "/v1/models", "POST", {}, token=API_KEY) == (
        405, {"detail": "Method Not Allowed"})


def test_access_log_lines_look_like_uvicorn(served):
    http(served.url + "/health")
    deadline = time.time() + 5
    while time.time() < deadline and '"GET /health HTTP/1.1" 200 OK' not in served.log():
        time.sleep(0.1)
    assert re.search(r'^INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK$', served.log(), re.M)


def test_api_key_flag_and_sigterm_exit(start_double, tiny_model):
    double = start_double([str(tiny_model), "--api-key", "flag-key"])
    double.wait_ready()
    assert http(double.url + "/v1/models", token="flag-key")[0] == 200
    assert http(double.url + "/v1/models")[0] == 401
    assert double.stop() == 0
    assert "INFO:     Application shutdown complete." in double.log()


def test_no_key_means_open_v1(start_double, tiny_model):
    double = start_double([str(tiny_model)])
    double.wait_ready()
    status, body = http(double.url + "/v1/models")
    assert status == 200 and body["data"][0]["id"] == str(tiny_model)


def test_missing_model_dir_fails_naming_the_path(run_double, tmp_path):
    missing = tmp_path / "models" / "not-there"
    result = run_double(["serve", str(missing), "--port", "0"])
    assert result.returncode == 1
    assert f"Invalid repository ID or local directory specified: '{missing}'" in result.stdout
    assert re.search(r"^ERROR \d\d-\d\d \d\d:\d\d:\d\d \[cli\.py:\d+\] vLLM test double failed: "
                     r"ValueError: Invalid repository ID", result.stdout, re.M)


def test_dir_without_config_fails(run_double, tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_double(["serve", str(tmp_path / "empty"), "--port", "0"])
    assert result.returncode == 1
    assert "ensure the presence of a 'config.json'" in result.stdout


def test_unsupported_architecture_fails(run_double, bad_arch_model):
    result = run_double(["serve", str(bad_arch_model), "--port", "0"])
    assert result.returncode == 1
    assert ("Model architectures ['Qwen3_5ForConditionalGeneration'] are not supported for now. "
            "Supported architectures: dict_keys([") in result.stdout
    assert "Loading safetensors checkpoint shards" not in result.stdout


def test_model_without_weights_fails(run_double, tmp_path):
    model = write_model(tmp_path / "no-weights", shards=0)
    result = run_double(["serve", str(model), "--port", "0"])
    assert result.returncode == 1
    assert f"Cannot find any model weights with `{model}`" in result.stdout


def test_max_model_len_above_the_model_fails(run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--port", "0", "--max-model-len", "8192"])
    assert result.returncode == 1
    assert "User-specified max_model_len (8192) is greater than the derived max_model_len" in result.stdout


def test_hf_repo_id_resolves_from_the_offline_cache(start_double, tmp_path):
    hub = tmp_path / "hf" / "hub"
    repo = hub / "models--lab--tiny"
    write_model(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    double = start_double(["lab/tiny"], HF_HUB_CACHE=str(hub))
    double.wait_ready()
    assert http(double.url + "/v1/models")[1]["data"][0]["root"] == "lab/tiny"


def test_taken_port_fails_before_loading(run_double, tiny_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_double(["serve", str(tiny_model), "--host", "127.0.0.1", "--port", str(port)])
    assert result.returncode == 1
    assert f"cannot bind 127.0.0.1:{port}" in result.stdout
    assert "Loading safetensors checkpoint shards" not in result.stdout


def test_multi_gpu_without_ray_is_refused(run_double, tiny_model):
    result = run_double(["serve", str(tiny_model), "--port", "0", "-tp", "2",
                         "--distributed-executor-backend", "mp"])
    assert result.returncode == 1
    assert "use --distributed-executor-backend ray" in result.stdout
