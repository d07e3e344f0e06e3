"""The remote services a Spark owner's nodes reach, stood up on the lab's management LAN for a test or a benchmark:
the real CNCF distribution registry (Debian's docker-registry) with a login, and the Hub double (lab/hub_double).

Both run on this machine at the management LAN's gateway address (config.REGISTRY, config.HUB_URL), where node1
reaches them and node2 reaches them only through node1: the internet, as a Spark behind one sees it. Each is a
process of its own, started and stopped by its context manager; a process killed by a test is one that died.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .config import HUB_URL, LAB_SRC, REGISTRY, STATE_DIR
from .run import LabError, wait_until

REGISTRY_USER = "lab"


@dataclass
class Registry:
    address: str  # host:port, as an image reference names it
    user: str
    password: str

    def ref(self, image: str) -> str:
        return f"{self.address}/{image}"


def _answers(url: str, headers: dict[str, str] | None = None) -> int | None:
    """The HTTP status of a GET, or None while nothing listens."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def registry() -> Iterator[Registry]:
    """The registry on the management LAN with htpasswd auth and a new password, its storage kept in the lab's state
    (what was pushed once is there for the next run)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise LabError("docker-registry is not installed (apt-get install docker-registry apache2-utils)")
    folder = STATE_DIR / "registry"
    (folder / "storage").mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(16)
    htpasswd = subprocess.run(["htpasswd", "-B", "-b", "-n", REGISTRY_USER, password], capture_output=True,
                              text=True, check=True).stdout
    (folder / "htpasswd").write_text(htpasswd)
    config = {"version": 0.1, "log": {"level": "warn"},
              "storage": {"filesystem": {"rootdirectory": str(folder / "storage")}, "delete": {"enabled": True}},
              "http": {"addr": REGISTRY},
              "auth": {"htpasswd": {"realm": "svl-lab", "path": str(folder / "htpasswd")}}}
    (folder / "config.yml").write_text(json.dumps(config))  # YAML reads JSON
    with open(folder / "registry.log", "ab") as log:
        proc = subprocess.Popen([binary, "serve", str(folder / "config.yml")], stdout=log, stderr=log,
                                start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None or _answers(f"http://{REGISTRY}/v2/") == 401, timeout=30,
                   what="the lab's registry", interval=0.2)
        if proc.poll() is not None:
            raise LabError(f"docker-registry exited at once (log: {folder / 'registry.log'})")
        yield Registry(REGISTRY, REGISTRY_USER, password)
    finally:
        _stop(proc)


def push_from_node1(reg: Registry, image: str) -> str:
    """The lab's image in the registry, pushed by node1's engine (which holds it, and reaches the registry); the
    registry's tag is removed from node1 again, so that the node holds only the lab's own. Layers the registry has
    already are not sent again."""
    ref = reg.ref(image)
    # The password on stdin, never on a command line.
    script = ('docker tag "$1" "$2" && docker login -u "$3" --password-stdin "$4" >/dev/null && docker push -q "$2" '
              '>/dev/null; rc=$?; docker logout "$4" >/dev/null; docker rmi "$2" >/dev/null; exit $rc')
    done = subprocess.run(["docker", "exec", "-i", "svl-lab-node1", "sh", "-c", script, "push", image, ref, reg.user,
                           reg.address], input=reg.password, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise LabError(f"node1 could not push {image} to {reg.address}: {done.stderr.strip()}")
    return ref


@dataclass
class Hub:
    """The Hub double's process, and what it reports."""
    url: str
    proc: subprocess.Popen
    data: Path
    tokens: dict[str, list[str]]
    rate_mib: float
    shard_mib: int = 4
    shards: int = 4

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/_double/stats", timeout=10) as r:
            return json.load(r)

    def served(self) -> dict[str, int]:
        return self.stats()["served"]

    def api_calls(self) -> list[list]:
        return [r for r in self.stats()["requests"] if r[1].startswith("/api/")]

    def control(self, what: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/_double/{what}", data=b"", method="POST"),
                               timeout=10).close()

    def kill(self) -> None:
        """As if the Hub died: SIGKILL, every connection reset."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def start(self) -> None:
        """Starts it (again): the same repos, the counters at zero."""
        host, port = self.url.split("//")[1].split(":")
        with open(self.data.parent / "hub.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(LAB_SRC / "hub_double" / "server.py"), "--bind", host, "--port", port,
                 "--data", str(self.data), "--tokens", json.dumps(self.tokens), "--rate-mib", str(self.rate_mib),
                 "--shard-mib", str(self.shard_mib), "--shards", str(self.shards)],
                stdout=log, stderr=log, start_new_session=True)
        wait_until(lambda: self.proc.poll() is not None or _answers(f"{self.url}/_double/stats") == 200, timeout=60,
                   what="the Hub double", interval=0.2)
        if self.proc.poll() is not None:
            raise LabError(f"the Hub double exited at once (log: {self.data.parent / 'hub.log'})")


@contextlib.contextmanager
def hub(tokens: dict[str, list[str]], rate_mib: float = 0.0, shard_mib: int = 4, shards: int = 4) -> Iterator[Hub]:
    """The Hub double on the management LAN; `tokens` maps each token to the gated or private repos it may read;
    its model has `shards` shards of `shard_mib` MiB."""
    folder = STATE_DIR / "hub"
    folder.mkdir(parents=True, exist_ok=True)
    double = Hub(HUB_URL, subprocess.Popen(["true"]), folder / "data", tokens, rate_mib, shard_mib, shards)
    try:
        double.start()
        yield double
    finally:
        _stop(double.proc)
