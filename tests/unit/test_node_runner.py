"""The node runner: the ssh options it gives, and `run` against a stand-in ssh that fails as a real one does."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from components.nodes import node_runner
from components.config.loader import load
from fixtures import stack_config, write_catalog
from harness import ROOT

# A stand-in `ssh`: fails to connect ($FAIL_FIRST times, with $FAIL_MESSAGE), else runs the remote command (its
# last argument) with sh, as sshd would. Every connection and every run of the command is counted.
FAKE_SSH = """#!/bin/sh
n=$(cat "$OUT/connections" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$OUT/connections"
if [ "$n" -le "${FAIL_FIRST:-0}" ]; then echo "$FAIL_MESSAGE" >&2; exit 255; fi
for last; do :; done
exec sh -c "$last"
"""


@pytest.fixture
def cluster(tmp_path):
    return load("t", stack_config(write_catalog(tmp_path / "catalog")), set(), ROOT).cluster


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(node_runner, "FIRST_BACKOFF_S", 0.01)
    return out


def count(out: Path, name: str) -> int:
    return int((out / name).read_text()) if (out / name).exists() else 0


def test_the_providers_ssh_options_through_a_jump_host(cluster):
    spark1 = cluster.node("spark1")
    key = cluster.ssh.key_file
    direct = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
              "-o", "StrictHostKeyChecking=accept-new", "-o", "ControlMaster=auto",
              "-o", "ControlPath=~/.cache/spark-vllm/ssh/%C", "-o", "ControlPersist=60",
              "-o", "IdentitiesOnly=yes", "-i", key]
    assert node_runner.provider_ssh_opts(cluster.ssh, None) == direct
    hop = ("ProxyCommand=ssh -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=15 "
           "-o StrictHostKeyChecking=accept-new -o ControlMaster=auto -o 'ControlPath=~/.cache/spark-vllm/ssh/%%C' "
           f"-o ControlPersist=60 -o IdentitiesOnly=yes -i {key} -p 22 -W %h:%p nvidia@10.10.10.11")
    assert node_runner.provider_ssh_opts(cluster.ssh, spark1) == [*direct, "-o", hop]


def test_building_a_command_line_creates_nothing(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    node_runner.ssh_argv(cluster.ssh, cluster.node("spark2"), cluster.node("spark1"), "true")
    node_runner.provider_ssh_opts(cluster.ssh, cluster.node("spark1"))
    assert not (tmp_path / "home").exists()


def test_the_providers_socket_folder_is_private(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    node_runner.ensure_control_dir(cluster.ssh)
    assert stat.S_IMODE((tmp_path / "home/.cache/spark-vllm/ssh").stat().st_mode) == 0o700


def test_run_opens_connections_of_its_own_on_every_hop(cluster, fake_ssh, tmp_path):
    """A shared connection whose link was cut answers only when ServerAlive gives up: a probe must not wait on it."""
    done = node_runner.run(cluster.ssh, cluster.node("spark2"), cluster.node("spark1"), "true")
    assert done.returncode == 0
    argv = " ".join(done.args)
    assert argv.count("ControlPath=none") == 2 and "ControlMaster" not in argv, argv
    assert not (tmp_path / "home").exists()  # and no socket folder


def test_a_connection_refused_is_tried_again_and_the_command_runs_once(cluster, fake_ssh, monkeypatch):
    monkeypatch.setenv("FAIL_FIRST", "2")
    monkeypatch.setenv("FAIL_MESSAGE", "ssh: connect to host 10.10.10.11 port 22: Connection refused")
    done = node_runner.run(cluster.ssh, cluster.node("spark1"), None, f"echo ran >> {fake_ssh}/runs; cat",
                           stdin="hello")
    assert (done.returncode, done.stdout, done.stderr) == (0, "hello", "")
    assert count(fake_ssh, "connections") == 3 and (fake_ssh / "runs").read_text() == "ran\n"


def test_connection_errors_give_up_after_the_last_attempt(cluster, fake_ssh, monkeypatch):
    monkeypatch.setenv("FAIL_FIRST", "9")
    monkeypatch.setenv("FAIL_MESSAGE", "kex_exchange_identification: Connection closed by remote host")
    done = node_runner.run(cluster.ssh, cluster.node("spark1"), None, "true")
    assert done.returncode == 255 and "Connection closed" in done.stderr
    assert count(fake_ssh, "connections") == node_runner.ATTEMPTS == 3


def test_a_command_that_ran_and_exited_255_is_not_run_again(cluster, fake_ssh):
    done = node_runner.run(cluster.ssh, cluster.node("spark1"), None,
                           f"echo ran >> {fake_ssh}/runs; echo oops >&2; exit 255")
    assert (done.returncode, done.stderr) == (255, "oops\n")
    assert count(fake_ssh, "connections") == 1 and (fake_ssh / "runs").read_text() == "ran\n"


def test_a_refused_key_is_not_tried_again(cluster, fake_ssh, monkeypatch):
    monkeypatch.setenv("FAIL_FIRST", "9")
    monkeypatch.setenv("FAIL_MESSAGE", "nvidia@10.10.10.11: Permission denied (publickey).")
    assert node_runner.run(cluster.ssh, cluster.node("spark1"), None, "true").returncode == 255
    assert count(fake_ssh, "connections") == 1


def test_run_is_bounded_retries_included(cluster, fake_ssh, monkeypatch):
    monkeypatch.setenv("FAIL_FIRST", "9")
    monkeypatch.setenv("FAIL_MESSAGE", "ssh: connect to host 10.10.10.11 port 22: Connection timed out")
    monkeypatch.setattr(node_runner, "FIRST_BACKOFF_S", 5)
    done = node_runner.run(cluster.ssh, cluster.node("spark1"), None, "true", timeout=1)
    assert done.returncode == 255 and count(fake_ssh, "connections") == 1  # no pause past the deadline
    monkeypatch.delenv("FAIL_FIRST")
    with pytest.raises(subprocess.TimeoutExpired):
        node_runner.run(cluster.ssh, cluster.node("spark1"), None, "sleep 5", timeout=0.5)


def test_the_hop_between_nodes_reads_its_key_from_the_scripts_folder(cluster):
    argv = node_runner.rsync_argv("/models/a b", cluster.node("spark2"), "192.168.200.2", compare="checksum",
                                  with_key=True)
    assert argv == ["rsync", "-a", "--whole-file", "--copy-links", "--exclude=/.*", "--checksum",
                    "--rsync-path=mkdir -p '/models/a b' && rsync", "-e",
                    "ssh -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=15 -o LogLevel=ERROR "
                    "-o Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com "
                    "-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=${SPARK_VLLM_SSH_DIR}/known_hosts "
                    "-o IdentitiesOnly=yes -o IdentityFile=${SPARK_VLLM_SSH_DIR}/key -p 22",
                    "/models/a b/", "nvidia@192.168.200.2:/models/a b/"]
