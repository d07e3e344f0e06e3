"""Helpers for the vLLM test double's tests: a fake model, running the double, a local Ray head.

The double runs from its source tree (PYTHONPATH=lab/vllm_double) with the test interpreter,
so these tests need no install; the Ray tests need `ray` importable in that interpreter.
(A uniquely named module, not conftest.py, so other test folders' conftests cannot shadow it.)
"""

import hashlib
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
DOUBLE_SRC = REPO / "lab" / "vllm_double"
# The stand-ins of the loaders' packages (fastsafetensors, instanttensor), importable as in the lab's Ray image.
LOADER_PACKAGES = DOUBLE_SRC / "loader_packages"
# Ray rewrites --node-ip-address 127.0.0.1 (and localhost) to the host's outward IP, so the
# lab-on-one-host uses another loopback address: traffic stays on lo.
RAY_NODE_IP = "127.0.0.2"


# Ports the tests hand to a double: below the kernel's ephemeral range, so that no other process's connection is
# given one between this check and the double's bind (the mp master binds 0.0.0.0), and above Ray's worker ports.
PORTS = range(20000, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]))


def free_port() -> int:
    for port in random.sample(PORTS, 100):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS}")


def double_env(**extra) -> dict:
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    env.pop("VLLM_HOST_IP", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DOUBLE_SRC), str(LOADER_PACKAGES), env.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["VLLM_DOUBLE_SHARD_DELAY_S"] = "0.05"
    env.update({key: str(value) for key, value in extra.items()})
    return env


def http(url: str, method: str = "GET", body=None, token=None, timeout: float = 10):
    """(status, parsed JSON or None) of one request to the double."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    return status, (json.loads(raw) if raw else None)


class Double:
    """One `vllm serve` process of the double, logging to a file."""

    def __init__(self, args, log_path: Path, **env):
        self.port = free_port()
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "vllm", "serve", *args, "--host", "127.0.0.1",
               "--port", str(self.port)]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=double_env(**env), start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"double exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if http(self.url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"double not ready within {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"double still running after {timeout}s:\n{self.log()}") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


def write_model(path: Path, arch: str = "Qwen3ForCausalLM", shards: int = 4,
                shard_bytes: int = 256 << 10, max_position_embeddings: int = 4096) -> Path:
    """A fake checkpoint: config.json and `shards` safetensors files of deterministic bytes."""
    path.mkdir(parents=True)
    config = {"architectures": [arch], "max_position_embeddings": max_position_embeddings}
    (path / "config.json").write_text(json.dumps(config))
    for index in range(1, shards + 1):
        seed = hashlib.sha256(f"{path.name}-{index}".encode()).digest()
        data = (seed * (shard_bytes // len(seed) + 1))[:shard_bytes]
        (path / f"model-{index:05d}-of-{shards:05d}.safetensors").write_bytes(data)
    return path


def _session_pids(sid: int) -> list:
    """Live processes of session `sid`: everything the `ray start` we launched spawned."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
            if int(session) == sid and state != "Z":  # zombies are gone already, only unreaped
                pids.append(int(entry.name))
    return pids


class RayNode:
    """A real Ray node (`ray start --block`) in its own session: the head, or a node joining it.

    Several nodes share this host on distinct loopback IPs (127.0.0.2, .3, ...), like Sparks
    with one GPU each. `env` is the node's own environment (its raylet's workers inherit it).
    """

    def __init__(self, log_path: Path, num_gpus: int, node_ip: str = RAY_NODE_IP,
                 head=None, env=None):
        self.ray_bin = Path(sys.executable).parent / "ray"
        self.node_ip = node_ip
        self.log_path = log_path
        self.temp_dir = None
        cmd = [str(self.ray_bin), "start", "--block", f"--num-gpus={num_gpus}",
               "--node-ip-address", node_ip, "--disable-usage-stats",
               "--dashboard-agent-listen-port", str(free_port()),
               "--metrics-export-port", str(free_port())]
        if head is None:
            self.address = f"{node_ip}:{free_port()}"
            self.temp_dir = tempfile.mkdtemp(prefix="vdray-", dir="/tmp")  # short: socket paths
            # No dashboard: nothing here reads it, and its ten processes cost each head seconds of CPU.
            cmd += ["--head", "--port", self.address.rsplit(":", 1)[1], "--include-dashboard=false",
                    "--ray-client-server-port", str(free_port()), "--temp-dir", self.temp_dir]
        else:
            self.address = head.address
            cmd += ["--address", head.address]
        self._log = open(log_path, "wb")
        # The raylet starts the Ray workers: give it the double's source tree too.
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=double_env(**(env or {})), start_new_session=True)

    def wait_started(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"ray start exited: {self.log_path.read_text()}")
            if "Ray runtime started" in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise AssertionError(f"Ray node not started in {timeout}s: {self.log_path.read_text()}")

    def pids(self) -> list:
        return _session_pids(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM the node's process group, then SIGKILL whatever of its session is left.

        A graceful `ray start --block` shutdown takes ~30 s here; this cluster is throwaway.
        """
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 20
        while (left := [pid for pid in self.pids() if pid != self.proc.pid]) and time.time() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()
        if self.temp_dir:
            subprocess.run(["rm", "-rf", self.temp_dir], check=False)


class RayCluster:
    """Nodes started in order (the first is the head) and stopped in reverse order."""

    def __init__(self, log_dir: Path, nodes: list):
        """nodes: [(node_ip, num_gpus, env or None), ...]"""
        self.nodes = []
        try:
            for node_ip, num_gpus, env in nodes:
                head = self.nodes[0] if self.nodes else None
                node = RayNode(log_dir / f"ray-{node_ip}.log", num_gpus, node_ip, head, env)
                self.nodes.append(node)
                node.wait_started()
        except BaseException:
            self.stop()
            raise
        self.address = self.nodes[0].address

    def pids(self) -> list:
        return [pid for node in self.nodes for pid in node.pids()]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


RAY = ["--distributed-executor-backend", "ray"]


def ray_env(cluster, **extra) -> dict:
    """Environment for a double (or a Ray client) to reach `cluster`."""
    return dict(RAY_ADDRESS=cluster.address, **extra)


def wait_gpus_free(cluster, gpus: float = 2.0, timeout: float = 60) -> None:
    """Ray frees a finished driver's placement group asynchronously: wait before the next test."""
    code = ("import ray; ray.init(address='auto', logging_level='ERROR', log_to_driver=False); "
            "print(ray.available_resources().get('GPU', 0))")
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run([sys.executable, "-c", code], env=double_env(**ray_env(cluster)),
                             capture_output=True, text=True, timeout=60).stdout.strip()
        if out and float(out.splitlines()[-1]) >= gpus:
            return
        time.sleep(1)
    raise AssertionError(f"Ray did not free {gpus} GPUs within {timeout}s")


def ray_skip_reason():
    if importlib.util.find_spec("ray") is None:
        return ("ray is not importable by this interpreter (the repo .venv has none): run these "
                "tests with a venv holding ray[default]==2.60.0, see lab/vllm_double/README.md")
    if not (Path(sys.executable).parent / "ray").exists():
        return f"no `ray` CLI next to {sys.executable}"
    return None
