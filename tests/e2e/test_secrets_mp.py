"""Secrets and exposure with `executor: mp` on the lab (the `lab-mp` stack, the lab's image without Ray).

The API key and HF token are rank 0's container environment (docs/security.md): `docker inspect` of rank 0 on the
head shows them, as documented; they show nowhere else (plain state, output, argv, the ranks' logs, the other
ranks). The ranks answer on the fabric only: from the management side the master port and every port a rank
opens reset the connection.
"""

from __future__ import annotations

import socket

import openai
import pytest

from conftest import lab_stack, node_sh
from test_secrets import API_KEY, HF_TOKEN, exposed_listeners, guarded, up_showing_no_secret, with_secrets

RANK0, RANK1 = "spark-vllm-mpsec-vllm-rank0", "spark-vllm-mpsec-vllm-rank1"


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory):
    for s in lab_stack(tmp_path_factory, lab2, "mpsec", executor="mp"):
        yield with_secrets(s)


def env_of(node: int, container: str) -> str:
    return node_sh(node, f"docker inspect -f '{{{{json .Config.Env}}}}' {container}")


def test_secrets_appear_only_in_rank0s_environment(stack):
    up_showing_no_secret(stack, lambda: {
        "rank 0's log": node_sh(1, f"docker logs {RANK0} 2>&1"),
        "rank 1's log": node_sh(2, f"docker logs {RANK1} 2>&1"),
        "rank 1's container": node_sh(2, f"docker inspect {RANK1}"),
        "rank 0's arguments": node_sh(1, f"docker inspect -f '{{{{json .Args}}}} {{{{json .Config.Cmd}}}}' {RANK0}"),
    })
    # Where they do live, as docs/security.md says: rank 0's environment, which vLLM reads.
    assert f"VLLM_API_KEY={API_KEY}" in env_of(1, RANK0) and f"HF_TOKEN={HF_TOKEN}" in env_of(1, RANK0)
    client = openai.OpenAI(base_url=stack.outputs()["baseUrl"], api_key="not-the-key", max_retries=0, timeout=15)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="lab-tiny", messages=[{"role": "user", "content": "hi"}])


def test_the_ranks_answer_on_the_fabric_only(stack):
    exposed = {node: exposed_listeners(node) for node in (1, 2)}
    print(f"listeners off loopback and the fabric address: {exposed}")
    assert exposed[1][29501] and exposed[1][8000]  # rank 0: the master port and the API, on 0.0.0.0
    for node in (1, 2):
        open_ports = {port: proc for port, proc in exposed[node].items() if port not in guarded(node)}
        assert open_ports == {22: "sshd"} | ({8000: exposed[1][8000]} if node == 1 else {}), f"node{node}"
    # Every port the ranks listen on, wherever they bind it (the fabric address included).
    rank_ports = {node: sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in node_sh(node, "ss -ltnpH")
                                .splitlines() if "python3" in line or "vllm" in line} - {8000})
                  for node in (1, 2)}
    print(f"the ranks' ports: {rank_ports}")
    assert 29501 in rank_ports[1] and len(rank_ports[2]) >= 1
    # From the management side, as anyone on that network: each resets the connection.
    for port in rank_ports[1]:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("172.29.87.11", port), timeout=5).close()
    socket.create_connection(("172.29.87.11", 8000), timeout=5).close()  # the API is meant to be reachable
    # node2 has no management address: its ranks' ports are on its fabric address, inside the guard too (above).
    # From the fabric, as the other ranks: the master port answers.
    node_sh(2, "python3 -c 'import socket; socket.create_connection((\"10.87.200.11\", 29501), 5)'")
