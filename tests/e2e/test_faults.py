"""Faults an operator meets: a second `up` at once, and an `up` interrupted while it waits for vLLM."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from stack import LabStack, chat


@pytest.fixture(scope="module")
def stack(lab2, tmp_path_factory):
    s = LabStack(tmp_path_factory.mktemp("flt"), "flt", "lab", lab2)
    # A slower load (4 shards x 2 s) leaves time to act while serve-ready waits.
    s.edit_catalog("clusters.yaml", lambda c: c["lab"]["env"].update(VLLM_DOUBLE_SHARD_DELAY_S="2"))
    s.up()
    yield s
    s.pulumi("destroy", timeout=600)


def start_up(stack: LabStack) -> subprocess.Popen:
    """`up` in the background, in its own process group, output to a file; returns once serve-ready waits."""
    log = stack.dir / "background-up.log"
    proc = subprocess.Popen(stack.command("up", "--skip-preview", "--yes"), cwd=stack.dir, env=stack.env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "loading weights" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    proc.log = log
    return proc


def assert_serving(stack: LabStack) -> None:
    out = stack.outputs()
    assert chat(out["baseUrl"], out["servedModel"])["choices"][0]["message"]["content"]


def test_a_second_up_is_refused_by_the_lock_and_changes_nothing(stack):
    stack.set_config("serve.maxModelLen", "2048")
    first = start_up(stack)
    second = stack.up(check=False)
    assert second.returncode != 0
    assert "the stack is currently locked by 1 lock(s)" in second.output
    assert first.wait(timeout=300) == 0, first.log.read_text()
    stack.up("--expect-no-changes")
    assert_serving(stack)


def test_an_interrupted_up_converges_on_the_next_up(stack):
    stack.set_config("serve.maxModelLen", "1024")
    proc = start_up(stack)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the engine cancels, letting running steps finish
    assert proc.wait(timeout=300) != 0
    assert "cancel" in proc.log.read_text().lower()
    stack.up()
    stack.up("--expect-no-changes")
    assert_serving(stack)


def test_a_killed_up_is_recovered_by_the_documented_commands(stack):
    stack.set_config("serve.maxModelLen", "2048")
    proc = start_up(stack)
    os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up: the lock and a pending step stay behind
    proc.wait(timeout=30)
    refused = stack.up(check=False)
    assert "the stack is currently locked" in refused.output
    # README, "An interrupted or killed `pulumi up`": cancel the lock, refresh (clearing pending creates), up.
    stack.pulumi("cancel", check=True)
    stack.pulumi("refresh", "--clear-pending-creates", check=True)
    stack.up()
    stack.up("--expect-no-changes")
    assert_serving(stack)
