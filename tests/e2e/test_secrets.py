"""Secrets and exposure on the lab.

The SSH key, the HF token and the API key never show in state, output, argv or logs. The API key does its job:
a real OpenAI client gets 401 without it and an answer with it. Ray answers on the fabric only: from the
management side (this machine, the workstation) every port Ray listens on refuses the connection.
"""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Callable

import openai
import pytest

from conftest import lab_stack, node_sh
from labstack import LabStack

API_KEY = f"sk-e2e-{secrets.token_hex(12)}"
HF_TOKEN = f"hf_e2e_{secrets.token_hex(12)}"
LAB_KEY = Path.home() / ".cache/spark-vllm/lab/id_ed25519"


def all_cmdlines() -> str:
    """Every process command line on this machine and, through each node's PID namespace, on the nodes."""
    script = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done"
    lines = [subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout]
    lines += [node_sh(node, script) for node in (1, 2)]
    return "\n".join(lines)


def with_secrets(s: LabStack) -> LabStack:
    """The stack with the API key and the HF token set, as secrets."""
    s.pulumi("config", "set", "--secret", "spark-vllm:apiKey", API_KEY, check=True)
    s.pulumi("config", "set", "--secret", "spark-vllm:hfToken", HF_TOKEN, check=True)
    return s


def up_showing_no_secret(stack: LabStack, more_places: Callable[[], dict[str, str]]) -> None:
    """`preview` and `up`; then neither secret, nor a line of the SSH key, is in their output, the exported state,
    any process command line on the machine and the nodes, or the texts `more_places()` reads after the up."""
    key_line = LAB_KEY.read_text().splitlines()[1]  # a line of the private key's body
    preview = stack.pulumi("preview", "--diff", check=True)
    up = stack.up()
    places = {
        "preview output": preview.output,
        "up output": up.output,
        "exported state": stack.pulumi("stack", "export", check=True).output,
        "process command lines": all_cmdlines(),
        **more_places(),
    }
    for secret in (API_KEY, HF_TOKEN, key_line):
        for place, text in places.items():
            assert secret not in text, f"a secret ({secret[:8]}…) appears in the {place}"


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory):
    # With Ray's dashboard, as users get it by default: its port is one the exposure scenario checks.
    for s in lab_stack(tmp_path_factory, lab2, "sec", catalog={"clusters.yaml": with_dashboard}):
        yield with_secrets(s)


def with_dashboard(clusters: dict) -> None:
    clusters["lab"]["ray"]["dashboard"] = True


def test_secrets_appear_nowhere_while_serving(stack):
    up_showing_no_secret(stack, lambda: {
        "serve log": node_sh(1, "docker exec spark-vllm-sec-ray-head cat /var/log/spark-vllm/serve.log")})
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


def exposed_listeners(node: int) -> dict[int, str]:
    """Port -> process of every TCP listener on the node that is not bound to loopback or the fabric address."""
    found = {}
    for line in node_sh(node, "ss -H -t -l -n -p").splitlines():
        local, users = line.split()[3], line.split()[-1]
        address, port = local.rsplit(":", 1)
        if address in ("127.0.0.1", "[::1]", f"10.87.200.{10 + node}") or address.startswith("127.0.0."):
            continue
        found[int(port)] = re.search(r'\("([^"]+)"', users).group(1)
    return found


def guarded(node: int) -> set[int]:
    ports = set()
    for rule in re.findall(r"--dport (\S+) .*-j REJECT", node_sh(node, "iptables -S")):
        low, _, high = rule.partition(":")
        ports |= set(range(int(low), int(high or low) + 1))
    return ports


def test_ray_answers_on_the_fabric_only(stack):
    stack.up()
    head = exposed_listeners(1)
    assert head[6379] == "gcs_server" and 8000 in head  # Ray binds its GCS on 0.0.0.0, whatever it is told
    for node in (1, 2):
        open_ports = {port: proc for port, proc in exposed_listeners(node).items() if port not in guarded(node)}
        assert open_ports == ({8000: "vllm"} if node == 1 else {}) | {22: "sshd"}, f"node{node}"
    # From the management side, as anyone on that network: every Ray port resets the connection.
    for port in sorted(set(head) - {22, 8000}) + [8265]:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("172.29.87.11", port), timeout=5).close()
    socket.create_connection(("172.29.87.11", 8000), timeout=5).close()  # the API is meant to be reachable
    # From the fabric, as Ray's own nodes: the GCS and the dashboard answer.
    node_sh(2, "python3 -c 'import socket; [socket.create_connection((\"10.87.200.11\", p), 5) for p in (6379, 8265)]'")
