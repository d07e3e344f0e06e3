"""The README's two commands, in that order, on the lab (issue 24): `scripts/try-lab`, then `scripts/test` (reduced to
one lab test), which takes the try-lab deployment down for the lab's tests and brings it back after them. Then both
lab nodes restart, and `scripts/try-lab` must end with a chat answer again (issue 21). Nothing may change a tracked
file, and an e2e stack is made on another passphrase than the try-lab one (issue 16)."""

from __future__ import annotations

import os
import re
import subprocess

from labstack import ROOT, LabStack


def tracked_changes() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True, check=True)
    return done.stdout


def try_lab(env) -> str:
    done = subprocess.run([str(ROOT / "scripts" / "try-lab")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"content"' in done.stdout, done.stdout  # the chat completion it prints
    return done.stdout + done.stderr


def new_shell(folder) -> None:
    """The README's commands for the lab stack, in a shell that has nothing but its login environment and the
    passphrase this test's stacks use (a user's own would be in their profile)."""
    readme = (ROOT / "README.md").read_text().split("In a new shell:", 1)[1].split("```sh\n", 1)[1].split("```")[0]
    commands = readme.replace("~/.cache/spark-vllm/try-lab", str(folder))
    shell = {"HOME": os.environ["HOME"], "PATH": "/usr/local/bin:/usr/bin:/bin",
             "PULUMI_CONFIG_PASSPHRASE": "first-use"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], env=shell, capture_output=True, text=True,
                          timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Traceback" not in said and not re.search(r"\s(ok|FAIL)\s+None\b", said), said
    assert re.search(r"^\s+one chat completion\s+ok ", done.stdout, re.M) and "baseUrl" in done.stdout, said


def test_try_lab_then_the_tests_then_try_lab_after_a_restart_change_no_tracked_file(lab2, tmp_path):
    before = tracked_changes()
    # Its own backend and project folder, so a user's own try-lab stack on this machine is left alone.
    env = {**os.environ, **lab2, "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
           "SPARK_VLLM_TRY_LAB_DIR": str(tmp_path / "try-lab"), "PULUMI_CONFIG_PASSPHRASE": "first-use"}
    (tmp_path / "state").mkdir()
    try:
        try_lab(env)
        assert tracked_changes() == before
        new_shell(tmp_path / "try-lab")
        tests = subprocess.run([str(ROOT / "scripts" / "test"), "tests/e2e/test_discover.py"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=1200)
        said = tests.stdout + tests.stderr
        assert tests.returncode == 0, said
        assert "taking it down for the lab tests" in said and "1 passed" in said, said
        assert "bringing your scripts/try-lab deployment back" in said and '"content"' in said, said
        assert tracked_changes() == before
        subprocess.run(["docker", "restart", "svl-lab-node1", "svl-lab-node2"], check=True, capture_output=True,
                       timeout=180)
        again = try_lab(env)
        assert "exited" in again and "recreated" in again, again  # what preflight found dead, and said
        assert tracked_changes() == before
        stack = LabStack(tmp_path / "tests", "first-use", "lab", lab2)  # `stack init` on the e2e passphrase
        stack.pulumi("config", "set", "--secret", "spark-vllm:apiKey", "first-use-key", check=True)
    finally:
        down = subprocess.run([str(ROOT / "scripts" / "try-lab"), "--down"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
    assert down.returncode == 0, down.stdout + down.stderr
    assert tracked_changes() == before
