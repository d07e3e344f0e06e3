"""A "node" for engine tests: this host's own dockerd, reached through an sshd the tests start on 127.0.0.1.

That is the path pulumi-docker takes to a Spark (ssh + `docker system dial-stdio`), with nothing leaving
loopback. The sshd accepts only a throwaway ed25519 key made for the test run.
"""

import os
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class LoopbackNode:
    port: int
    key: Path

    @property
    def host(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    @property
    def ssh_opts(self) -> list[str]:
        return ["-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR"]

    def ssh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", *self.ssh_opts, "-o", "BatchMode=yes", "-p", str(self.port), "root@127.0.0.1",
                               command], capture_output=True, text=True, timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@contextmanager
def loopback_node(workdir: Path):
    """Yields a LoopbackNode; its sshd stops when the context ends."""
    host_key = keygen(workdir / "ssh_host_ed25519_key")
    key = keygen(workdir / "id_ed25519")
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{key}.pub").read_text())
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    port = free_port()
    log = open(workdir / "sshd.log", "w")
    sshd = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", "/dev/null", "-p", str(port), "-h", str(host_key),
         "-o", "ListenAddress=127.0.0.1", "-o", f"AuthorizedKeysFile={authorized}",
         "-o", f"PidFile={workdir / 'sshd.pid'}", "-o", "StrictModes=no", "-o", "PermitRootLogin=prohibit-password"],
        stdout=log, stderr=subprocess.STDOUT)
    node = LoopbackNode(port, key)
    try:
        deadline = time.monotonic() + 15
        while node.ssh("true").returncode != 0:
            if sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"loopback sshd did not come up: {(workdir / 'sshd.log').read_text()}")
            time.sleep(0.2)
        yield node
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
        log.close()
