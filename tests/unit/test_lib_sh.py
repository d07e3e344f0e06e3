"""scripts/lib.sh's set-up steps, run by bash against stand-ins of the commands they start."""

import os
import subprocess
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "scripts" / "lib.sh"


def test_the_started_dockerd_holds_none_of_the_callers_descriptors(tmp_path):
    """Under `flock LOCK scripts/test`, a dockerd that kept flock's descriptor held the lab's lock for its life."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "dockerd.pid"
    (bin_dir / "dockerd").write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    (bin_dir / "docker").write_text(f"#!/bin/sh\n[ \"$1\" = info ] && [ -s {pid_file} ]\n")
    for stand_in in bin_dir.iterdir():
        stand_in.chmod(0o755)
    lock = tmp_path / "lock"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SPARK_VLLM_DOCKERD_LOG": str(tmp_path / "dockerd.log")}
    done = subprocess.run(["flock", str(lock), "bash", "-c", f". {LIB}; exec 7>{tmp_path / 'other'}; ensure_docker"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    pid = int(pid_file.read_text())
    try:
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert str(lock) not in held and str(tmp_path / "other") not in held, held
        # And so the lock is free while the daemon runs.
        free = subprocess.run(["flock", "-n", str(lock), "true"], timeout=10)
        assert free.returncode == 0
    finally:
        os.kill(pid, 15)
