"""The gateway in the lab: the shipped several-models example, one OpenAI endpoint in front of two model stacks.

`lab-n1` serves lab-tiny on node1 and `lab-n2` on node2 (with an API key of its own), each on one GPU; the gateway
stack `lab-gateway` runs the lab's build of the pinned LiteLLM proxy on node1 and reads both stacks' outputs from
the same backend. Through the real `openai` client: both models are listed and answer chat, completions and streams
with usage, and `scripts/status` and `scripts/logs` see the gateway; no key, no answer. A model whose vLLM is
killed fails alone, with its name in the error and its row in `scripts/status`. A destroyed
model stack's route goes, in `preview` first; the other's requests are timed through that change (the gap), and
the gateway's latency against a direct call is measured. Figures are printed, not asserted.
"""

from __future__ import annotations

import json
import re
import secrets
import statistics
import threading
import subprocess
import time
import urllib.error

import openai
import pytest

from conftest import lab, lab_stack, node_sh
from labstack import ROOT, LabStack, chat, planned

GATEWAY_KEY = f"sk-gateway-e2e-{secrets.token_hex(12)}"
N2_KEY = f"sk-n2-e2e-{secrets.token_hex(12)}"
MODELS = ["lab-n1", "lab-n2"]


@pytest.fixture(scope="module")
def lab2(engine_env):
    """The two-node lab, with the gateway's image on node1 (which only the gateway stacks need)."""
    lab("up", "--nodes", "2", "--gateway", "--no-status")
    return engine_env


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """The backend the three stacks share: the gateway reads the model stacks' outputs there."""
    return tmp_path_factory.mktemp("gateway-state")


@pytest.fixture(scope="module")
def n1(lab2, tmp_path_factory, state):
    yield from lab_stack(tmp_path_factory, lab2, "lab-n1", source="lab-n1", state=state, up=True)


@pytest.fixture(scope="module")
def n2(lab2, tmp_path_factory, state):
    for s in lab_stack(tmp_path_factory, lab2, "lab-n2", source="lab-n2", state=state):
        s.set_config("apiKey", N2_KEY, secret=True)  # a route with a key of its own
        s.up()
        yield s


@pytest.fixture(scope="module")
def gw(lab2, tmp_path_factory, state, n1, n2):
    for s in lab_stack(tmp_path_factory, lab2, "lab-gateway", source="lab-gateway", state=state):
        s.set_config("gatewayKey", GATEWAY_KEY, secret=True)
        s.up()
        yield s


def script(s: LabStack, name: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/status or scripts/logs on the stack, as a user runs them in its project folder."""
    return subprocess.run([str(ROOT / "scripts" / name), "--stack", s.stack, *args], cwd=s.dir, env=s.env,
                          capture_output=True, text=True, timeout=180)


def client(gw: LabStack, key: str = GATEWAY_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.outputs()["baseUrl"], api_key=key, max_retries=0, timeout=30)


def listed(c: openai.OpenAI) -> list[str]:
    return sorted(m.id for m in c.models.list())


def ask(c: openai.OpenAI, model: str) -> str:
    reply = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "ping"}], max_tokens=8)
    return reply.choices[0].message.content


def test_one_endpoint_lists_both_models_and_passes_chat_completions_and_streams_through(gw):
    c = client(gw)
    assert listed(c) == MODELS
    for model in MODELS:
        assert ask(c, model)
        assert c.completions.create(model=model, prompt="ping", max_tokens=8).choices[0].text
        chunks = list(c.chat.completions.create(model=model, messages=[{"role": "user", "content": "count"}],
                                                max_tokens=8, stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        usage = [ch.usage for ch in chunks if ch.usage]
        assert text and usage and usage[-1].completion_tokens > 0, chunks
    assert gw.outputs()["routes"] == {"lab-n1": "http://10.87.200.11:8000/v1", "lab-n2": "http://10.87.200.12:8000/v1"}
    status = script(gw, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for row in ("container spark-vllm-lab-gateway-gateway", "/health/liveliness", "/v1/models", "lab-n1 through it",
                "lab-n2 through it"):
        assert re.search(rf"{re.escape(row)}\s+ok ", status.stdout), status.stdout
    logs = script(gw, "logs", "-n", "50")
    assert logs.returncode == 0 and '"GET /health/liveliness HTTP/1.1" 200' in logs.stdout, logs.stdout + logs.stderr


def test_without_the_gateway_key_nothing_answers(gw):
    with pytest.raises(urllib.error.HTTPError) as no_key:
        chat(gw.outputs()["baseUrl"], "lab-n1")
    assert no_key.value.code == 401, no_key.value
    with pytest.raises(openai.BadRequestError) as wrong_key:  # LiteLLM answers a wrong key with 400
        ask(client(gw, "sk-not-the-key"), "lab-n1")
    assert wrong_key.value.status_code == 400, wrong_key.value


def test_no_key_is_in_the_state_the_output_or_the_routers_command(gw, n2, state):
    outputs = [gw.pulumi("preview", "--diff", check=True).output, n2.pulumi("preview", "--diff", check=True).output]
    stored = "\n".join(p.read_text() for p in state.rglob("*.json"))
    args = node_sh(1, "docker inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}} {{json .Config.Labels}}' "
                      "spark-vllm-lab-gateway-gateway")
    for key in (GATEWAY_KEY, N2_KEY):
        for place, text in (("preview", "\n".join(outputs)), ("state", stored), ("router's command", args)):
            assert key not in text, f"a key ({key[:12]}…) appears in the {place}"


def test_a_dead_model_fails_alone_and_answers_again_once_up_restarts_it(gw, n2):
    c = client(gw)
    node_sh(2, "docker exec spark-vllm-lab-n2-ray-head sh -c 'kill -KILL -$(cat /run/spark-vllm/serve.pid)'")
    with pytest.raises(openai.APIStatusError) as e:
        ask(c, "lab-n2")
    assert "lab-n2" in str(e.value), e.value
    assert ask(c, "lab-n1")
    assert listed(c) == MODELS  # a route is config: the model is listed while its backend is down
    status = script(gw, "status")
    assert status.returncode == 1, status.stdout + status.stderr
    assert re.search(r"lab-n2 through it\s+FAIL\s+500 from http://10.87.200.12:8000/v1: 'Hosted_vllmException",
                     status.stdout), status.stdout
    assert re.search(r"lab-n1 through it\s+ok ", status.stdout), status.stdout
    assert "its own stack's: `scripts/status --stack <it>`" in status.stdout, status.stdout
    n2.up()
    assert ask(c, "lab-n2")
    assert planned(gw.pulumi("preview", check=True)) == {}  # the same route: nothing of the gateway changes


class Pinger(threading.Thread):
    """Asks the gateway for lab-n1 back to back; records when each request started and whether it answered."""

    def __init__(self, c: openai.OpenAI):
        super().__init__(daemon=True)
        self.c, self.results, self.stop = c, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                ok = bool(ask(self.c, "lab-n1"))
            except openai.APIError:
                ok = False
            self.results.append((start, ok))
            time.sleep(0.1)

    def gap(self) -> float:
        """From the first failed request to the next answered one (0 when none failed)."""
        failed = [t for t, ok in self.results if not ok]
        if not failed:
            return 0.0
        after = [t for t, ok in self.results if ok and t > failed[0]]
        assert after, "lab-n1 never answered again"
        return after[0] - failed[0]


def test_a_destroyed_model_stack_loses_its_route_shown_by_preview_and_the_gap_is_measured(gw, n1, n2):
    c = client(gw)
    n2.pulumi("destroy", check=True, timeout=600)
    preview = gw.pulumi("preview", "--diff", check=True)
    assert planned(preview) == {"gateway-container": "replace", "gateway-ready-gate": "replace"}, preview.output
    assert "lab-n2" in preview.output and "10.87.200.12" in preview.output, preview.output
    pinger = Pinger(c)
    pinger.start()
    started = time.monotonic()
    gw.up()
    took = time.monotonic() - started
    deadline = time.monotonic() + 30  # lab-n1 answering once more after the up, so that a gap is closed
    while not any(ok and t > started + took for t, ok in pinger.results):
        assert time.monotonic() < deadline, "lab-n1 did not answer through the gateway after its up"
        time.sleep(0.1)
    pinger.stop.set()
    pinger.join(60)
    print(f"\ngateway route change: `pulumi up` {took:.1f} s; lab-n1 unanswered for {pinger.gap():.1f} s "
          f"({sum(not ok for _, ok in pinger.results)} of {len(pinger.results)} requests failed)")
    assert listed(c) == ["lab-n1"]
    with pytest.raises(openai.APIStatusError) as e:
        ask(c, "lab-n2")
    assert e.value.status_code == 400 and "lab-n2" in str(e.value), e.value
    assert json.loads(node_sh(1, "docker inspect -f '{{index .Config.Labels \"spark-vllm.routes\"}}' "
                                 "spark-vllm-lab-gateway-gateway")) == {"lab-n1": "http://10.87.200.11:8000/v1"}


def test_the_gateways_latency_against_a_direct_call(gw, n1):
    direct = openai.OpenAI(base_url=n1.outputs()["baseUrl"], api_key="none", max_retries=0, timeout=30)
    through = client(gw)

    def timings(c: openai.OpenAI, n: int = 100) -> list[float]:
        out = []
        for _ in range(n):
            start = time.perf_counter()
            assert ask(c, "lab-n1")
            out.append((time.perf_counter() - start) * 1000)
        return sorted(out)

    rows = {"direct": timings(direct), "gateway": timings(through)}
    for name, ms in rows.items():
        print(f"\nlab-n1 {name}: median {statistics.median(ms):.1f} ms, p99 {ms[98]:.1f} ms "
              f"({len(ms)} chat completions)")
