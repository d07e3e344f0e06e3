"""What real clients ask of vLLM: streaming chat (server-sent events), /v1/completions and /metrics.

The `openai` client is the real one; the raw stream is read off the socket, so the framing is checked too.
"""

import http.client as httpclient
import json

import openai
import pytest
from vllm_double_support import Double, http, write_model

KEY = "client-key"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    double = Double([str(write_model(root / "lab-tiny")), "--served-model-name", "lab-tiny",
                     "--max-model-len", "64"], root / "double.log", VLLM_API_KEY=KEY)
    try:
        double.wait_ready(timeout=60)
        yield double
    finally:
        double.stop()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def raw_stream(served, path: str, body: dict) -> tuple[int, str, bytes]:
    conn = httpclient.HTTPConnection("127.0.0.1", served.port, timeout=10)
    conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {KEY}",
                                                  "Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()  # http.client undoes the chunked transfer encoding
    conn.close()
    return response.status, response.getheader("Content-Type"), data


def test_openai_client_streams_a_chat(client):
    stream = client.chat.completions.create(model="lab-tiny", stream=True,
                                            messages=[{"role": "user", "content": "stream these words"}])
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "[lab-tiny] stream these words"
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_stream_is_server_sent_events_ending_with_done(served):
    status, content_type, data = raw_stream(served, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "a b c"}], "stream": True, "max_tokens": 2,
        "stream_options": {"include_usage": True}})
    assert status == 200 and content_type.startswith("text/event-stream")
    events = data.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert [p["choices"][0]["delta"].get("content") for p in payloads[:-1]] == ["", "[lab-tiny]", " a"]
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_openai_client_completions(client):
    done = client.completions.create(model="lab-tiny", prompt="complete me please")
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert done.choices[0].text == "[lab-tiny] complete me please"
    assert done.usage.prompt_tokens == 3 and done.usage.completion_tokens == 4
    cut = client.completions.create(model="lab-tiny", prompt="one two three", max_tokens=2)
    assert cut.choices[0].text == "[lab-tiny] one" and cut.choices[0].finish_reason == "length"
    streamed = client.completions.create(model="lab-tiny", prompt="x y", stream=True)
    assert "".join(c.choices[0].text for c in streamed) == "[lab-tiny] x y"


def test_completions_default_to_16_tokens_as_vllm(served):
    status, body = http(served.url + "/v1/completions", "POST",
                        {"prompt": " ".join(str(i) for i in range(30))}, token=KEY)
    assert status == 200
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"


def test_completions_need_the_key_and_a_prompt(served):
    assert http(served.url + "/v1/completions", "POST", {"prompt": "x"})[0] == 401
    status, body = http(served.url + "/v1/completions", "POST", {"prompt": 7}, token=KEY)
    assert status == 400 and body["error"]["param"] == "prompt"


def test_stream_options_without_stream_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="Stream options can only be defined when `stream=True`"):
        client.chat.completions.create(model="lab-tiny", messages=[{"role": "user", "content": "x"}],
                                       stream_options={"include_usage": True})


def test_metrics_in_prometheus_text_count_the_requests(served):
    before = _metrics(served)
    http(served.url + "/v1/chat/completions", "POST", {"messages": [{"role": "user", "content": "m n"}]}, token=KEY)
    after = _metrics(served)
    label = 'model_name="lab-tiny"'
    assert after[f"vllm:prompt_tokens_total{{{label}}}"] - before[f"vllm:prompt_tokens_total{{{label}}}"] == 2
    assert after[f"vllm:generation_tokens_total{{{label}}}"] - before[
        f"vllm:generation_tokens_total{{{label}}}"] == 3
    stop = f'vllm:request_success_total{{{label},finished_reason="stop"}}'
    assert after[stop] - before.get(stop, 0) == 1
    assert after[f"vllm:num_requests_running{{{label}}}"] == 0


def _metrics(served) -> dict:
    conn = httpclient.HTTPConnection("127.0.0.1", served.port, timeout=10)
    conn.request("GET", "/metrics")  # open without the key, as in vLLM
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    text = response.read().decode()
    conn.close()
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}
