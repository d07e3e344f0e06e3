"""Secrets on the lab: the SSH key, the HF token and the API key never show in state, output, argv or logs.

The API key also does its job: a real OpenAI client gets 401 without it and an answer with it.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import openai
import pytest

from conftest import node_sh
from stack import LabStack

API_KEY = f"sk-e2e-{secrets.token_hex(12)}"
HF_TOKEN = f"hf_e2e_{secrets.token_hex(12)}"
LAB_KEY = Path.home() / ".cache/spark-vllm/lab/id_ed25519"


def all_cmdlines() -> str:
    """Every process command line on this machine and, through each node's PID namespace, on the nodes."""
    script = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done"
    lines = [subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout]
    lines += [node_sh(node, script) for node in (1, 2)]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory):
    s = LabStack(tmp_path_factory.mktemp("sec"), "sec", "lab", lab2)
    s.pulumi("config", "set", "--secret", "spark-vllm:apiKey", API_KEY, check=True)
    s.pulumi("config", "set", "--secret", "spark-vllm:hfToken", HF_TOKEN, check=True)
    yield s
    s.pulumi("destroy", timeout=600)


def test_secrets_appear_nowhere_while_serving(stack):
    key_line = LAB_KEY.read_text().splitlines()[1]  # a line of the private key's body
    preview = stack.pulumi("preview", "--diff", check=True)
    up = stack.up()
    places = {
        "preview output": preview.output,
        "up output": up.output,
        "exported state": stack.pulumi("stack", "export", check=True).output,
        "process command lines": all_cmdlines(),
        "serve log": node_sh(1, "docker exec spark-vllm-sec-ray-head cat /var/log/spark-vllm/serve.log"),
    }
    for secret in (API_KEY, HF_TOKEN, key_line):
        for place, text in places.items():
            assert secret not in text, f"a secret ({secret[:8]}…) appears in the {place}"
    # Where the secrets do live: a root-only file in the head container, read by vLLM at start.
    assert node_sh(1, "docker exec spark-vllm-sec-ray-head stat -c %a /run/spark-vllm/serve.env").strip() == "600"


def test_the_api_key_is_enforced_for_a_real_openai_client(stack):
    out = stack.outputs()
    without = openai.OpenAI(base_url=out["baseUrl"], api_key="not-the-key", max_retries=0, timeout=15)
    with pytest.raises(openai.AuthenticationError):
        without.chat.completions.create(model=out["servedModel"], messages=[{"role": "user", "content": "hi"}])
    client = openai.OpenAI(base_url=out["baseUrl"], api_key=API_KEY, max_retries=0, timeout=15)
    answer = client.chat.completions.create(model=out["servedModel"], messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content
