"""Switching models on one cluster, through the real engine in the lab: a second model's stack brought up while the
first still serves is refused by preflight before it creates anything, naming the first stack, whether the SSH
user is root (`ss -p` names the port's holder) or a user of the docker group who is not (`docker ps` names the
stacks that run there). Once the first is destroyed, the second comes up.

The user who is not root is made for this module on both nodes, and removed after it: the lab's node image has
root alone, and a new image would restart the lab under every other run.
"""

from __future__ import annotations

import re

import pytest

from conftest import lab_stack, node_sh
from labstack import chat
from test_preflight import rows

USER = "svl-switch"
FIRST_HEAD = "spark-vllm-sw1-ray-head"
REFUSED_AS_ROOT = re.compile(r"29501 \(mp master\) free; 8000 \(API\) is held by \S+ \(pid \d+\) in "
                             rf"{FIRST_HEAD} of stack sw1\. Fix: destroy that stack first \(`pulumi destroy -s sw1`\), "
                             r"or give this stack a spark-vllm:portSlot of its own \(docs/placement\.md\)")


@pytest.fixture(scope="module")
def first(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "sw1")


@pytest.fixture(scope="module")
def second(lab2, tmp_path_factory):
    yield from lab_stack(tmp_path_factory, lab2, "sw2", executor="mp")


@pytest.fixture(scope="module")
def user(lab2):
    """A user of each node's docker group, neither root nor a sudoer, who logs in with the lab's key."""
    for node in (1, 2):
        # `-p '*'`: no password, but not a locked account, which sshd without PAM refuses even a key.
        node_sh(node, f"useradd -m -p '*' -G docker {USER} && "
                      f"install -d -m 700 -o {USER} -g {USER} /home/{USER}/.ssh && "
                      f"install -m 600 -o {USER} -g {USER} /root/.ssh/authorized_keys /home/{USER}/.ssh/")
    yield USER
    for node in (1, 2):
        node_sh(node, f"pkill -u {USER}; userdel -f -r {USER}", check=False)


def containers(stack: str) -> list[str]:
    return [name for node in (1, 2) for name in node_sh(
        node, f"docker ps -a --filter label=spark-vllm.stack={stack} --format '{{{{.Names}}}}'").split()]


def test_the_first_model_serves(first):
    first.up()
    out = first.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"


def test_a_second_model_is_refused_naming_the_first_stack(first, second):
    run = second.up(check=False)
    assert run.returncode != 0
    result, reason = rows(run)[("node1", "ports")]
    assert result == "FAIL" and REFUSED_AS_ROOT.fullmatch(reason), run.output
    assert containers("sw2") == [] and FIRST_HEAD in containers("sw1")


def test_a_user_who_is_not_root_is_refused_naming_the_first_stack_too(first, second, user):
    second.edit_catalog("clusters.yaml", lambda catalog: catalog["lab"]["ssh"].update(user=user))
    run = second.up(check=False)
    assert run.returncode != 0
    assert rows(run)[("node1", "ssh+docker")][1].startswith(f"ssh {user}@"), run.output
    assert rows(run)[("node1", "ports")] == (
        "FAIL", f"29501 (mp master) free; 8000 (API) is in use while stack sw1 runs here ({FIRST_HEAD}; ss names a "
                "port's owner only to root). Fix: destroy that stack first (`pulumi destroy -s sw1`), or give this "
                "stack a spark-vllm:portSlot of its own (docs/placement.md)"), run.output
    assert containers("sw2") == []
    second.edit_catalog("clusters.yaml", lambda catalog: catalog["lab"]["ssh"].update(user="root"))


def test_after_the_first_is_destroyed_the_second_serves(first, second):
    first.pulumi("destroy", check=True, timeout=600)
    assert containers("sw1") == []
    second.up()
    out = second.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"] == "[lab-tiny] ping"
