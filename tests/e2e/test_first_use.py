"""The README's two commands, in that order, on the lab (issue 24): `scripts/try-lab`, then `scripts/test` (reduced to
one lab test), which takes the try-lab deployment down for the lab's tests and brings it back after them. Then both
lab nodes restart, and `scripts/try-lab` must end with a chat answer again (issue 21). Nothing may change a tracked
file, and an e2e stack is made on another passphrase than the try-lab one (issue 16)."""

from __future__ import annotations

import os
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


def test_try_lab_then_the_tests_then_try_lab_after_a_restart_change_no_tracked_file(lab2, tmp_path):
    before = tracked_changes()
    # Its own backend and project folder, so a user's own try-lab stack on this machine is left alone.
    env = {**os.environ, **lab2, "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
           "SPARK_VLLM_TRY_LAB_DIR": str(tmp_path / "try-lab"), "PULUMI_CONFIG_PASSPHRASE": "first-use"}
    (tmp_path / "state").mkdir()
    try:
        try_lab(env)
        assert tracked_changes() == before
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
