"""What the runner observes on the lab, through its own access (docker exec into the node containers), so
that observing never adds to what is timed: containers, the API, serve logs, Ray's node table, SSH floors."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable

SSH_CONFIG = Path(os.path.expanduser("~/.cache/spark-vllm/lab/ssh_config"))
API = "http://172.29.87.11:8000/v1/models"  # the lab head's management address, as the stack's baseUrl
HEAD_FABRIC_IP = "10.87.200.11"
MODEL = "lab-tiny"


def node_sh(node: int, script: str, check: bool = True) -> str:
    done = subprocess.run(["docker", "exec", f"svl-lab-node{node}", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(f"node{node}: {script}\n{done.stdout}{done.stderr}")
    return done.stdout


def lab_nodes() -> list[int]:
    names = subprocess.run(["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True,
                           check=True).stdout.split()
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"svl-lab-node(\d+)", n)))


def containers(nodes: list[int]) -> dict[str, str]:
    """Container id -> node:name, of every running container on the given nodes (a stack's load turn, created and
    never started, is a lock, not a container that serves)."""
    out = {}
    for node in nodes:
        for line in node_sh(node, "docker ps --no-trunc --format '{{.ID}} {{.Names}}'").splitlines():
            cid, name = line.split()
            out[cid] = f"node{node}:{name}"
    return out


def nodes_cpu_s(nodes: list[int]) -> float:
    """CPU seconds the lab's node containers have spent (their sshd, dockerd, containers and probes), from their
    cgroups: on real Sparks that work runs on each node's own cores, beside the others'."""
    total = 0.0
    ids = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", *(f"svl-lab-node{node}" for node in nodes)],
                         capture_output=True, text=True, check=True).stdout.split()  # one call for every node
    for cid in ids:
        v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")  # cgroup v1: nanoseconds
        if v1.exists():
            total += int(v1.read_text()) / 1e9
            continue
        stat = Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat").read_text()  # v2: microseconds
        total += int(re.search(r"^usage_usec (\d+)", stat, re.M).group(1)) / 1e6
    return total


def restarted(before: dict[str, str], after: dict[str, str]) -> int:
    """Containers that ran before and are gone after (each replaced one counts once)."""
    return len(set(before) - set(after))


class Stopped(RuntimeError):
    """What was waited for stopped before it served."""


def wait_models(max_model_len: int, start: float, timeout: float = 300,
                alive: Callable[[], bool] | None = None) -> float:
    """Seconds from `start` (time.monotonic) until /v1/models lists the model with this max_model_len. With
    `alive`, asked every 2 s, a serve that stopped ends the wait at once."""
    deadline = time.monotonic() + timeout
    asked = time.monotonic()
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(API, timeout=2) as r:
                cards = json.loads(r.read())["data"]
            if any(c["id"] == MODEL and c.get("max_model_len") == max_model_len for c in cards):
                return time.monotonic() - start
        except (OSError, ValueError, KeyError):
            pass
        if alive is not None and time.monotonic() - asked >= 2:
            asked = time.monotonic()
            if not alive():
                raise Stopped(f"the serve stopped after {time.monotonic() - start:.1f} s, before {API} listed "
                              f"{MODEL}")
        time.sleep(0.1)
    raise TimeoutError(f"{API} did not list {MODEL} (max_model_len {max_model_len}) within {timeout:g} s")


def wait_down(timeout: float = 60) -> None:
    """Until the API stops answering: a killed rank takes rank 0 down a moment later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(API, timeout=1).close()
        except (OSError, ValueError):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{API} still answers {timeout:g} s after a rank was killed")


def ssh_round_trip(host: str) -> float:
    """One `ssh <host> true` with the lab's ssh config: a new connection each time, as each ssh call makes."""
    start = time.monotonic()
    subprocess.run(["ssh", "-F", str(SSH_CONFIG), host, "true"], check=True, capture_output=True, timeout=60)
    return time.monotonic() - start


def serve_log(node: int, container: str, path: str) -> str:
    return node_sh(node, f"docker exec {container} cat {path}", check=False)


def load_seconds(log: str) -> float | None:
    """The stand-in's own figure for reading the shards ("Loading weights took X seconds", as vLLM logs)."""
    m = re.search(r"Loading weights took ([0-9.]+) seconds", log)
    return float(m.group(1)) if m else None


# Lines the vLLM double logs when serve asks Ray for its placement before every worker has joined.
EARLY_SERVE = ("exceeds the total number of available GPUs", "Waiting for creating a placement group",
               "Cannot provide a placement group", "vLLM test double failed")


def started_early(log: str) -> bool:
    return any(marker in log for marker in EARLY_SERVE)


def started_at(node: int, container: str) -> float:
    """A container's start, in Unix seconds (the lab nodes share this host's clock)."""
    stamp = node_sh(node, f"docker inspect -f '{{{{.State.StartedAt}}}}' {container}").strip()
    return _unix(stamp)


# Each alive node's fabric IP and registration time (ms), from Ray's GCS: the lab runs no dashboard to ask.
GCS_NODES = ("from ray._raylet import GcsClient\n"
             "for info in GcsClient(address='{address}').get_all_node_info().values():\n"
             "    if info.state == 0: print(info.node_manager_address, info.start_time_ms)  # 0: ALIVE")


def ray_node_starts(node: int, container: str) -> dict[str, float]:
    """Fabric IP -> Unix seconds at which that node's raylet registered with the head's GCS."""
    script = GCS_NODES.format(address=f"{HEAD_FABRIC_IP}:6379")
    body = node_sh(node, f"docker exec {container} python3 -c {shlex.quote(script)}")
    return {ip: int(ms) / 1000 for ip, ms in (line.split() for line in body.splitlines())}


def _unix(rfc3339: str) -> float:
    """Docker's nanosecond RFC 3339 UTC stamp as Unix seconds (datetime parses only microseconds)."""
    from datetime import datetime, timezone
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    base = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return base + float(f"0.{frac or 0}")


def deployment(node: int, container: str) -> dict:
    """What a Ray container runs with, minus what only names it (name, labels, id) and spark-vllm's own log
    volume: for the parity check."""
    info = json.loads(node_sh(node, f"docker inspect {container}"))[0]
    host = info["HostConfig"]
    return {
        "image": info["Image"],
        "entrypoint": info["Config"]["Entrypoint"],
        "cmd": info["Config"]["Cmd"],
        "env": sorted(e for e in info["Config"]["Env"] if not e.startswith("PATH=")),
        "network": host["NetworkMode"], "ipc": host["IpcMode"], "shm": host["ShmSize"],
        "ulimits": sorted((u["Name"], u["Soft"], u["Hard"]) for u in host.get("Ulimits") or []),
        # spark-vllm's own volume (the serve log that outlives the container) feeds nothing to Ray or vLLM.
        "mounts": sorted((m["Source"], m["Destination"], m["RW"]) for m in info["Mounts"]
                         if not m.get("Name", "").startswith("spark-vllm-")),
        "devices": host.get("Devices") or [], "caps": host.get("CapAdd") or [],
        "restart": host["RestartPolicy"]["Name"] or "no",
    }


def serve_argv(node: int, container: str) -> list[str]:
    """The running `vllm serve` command line, from `serve` on (the interpreter path before it is the image's)."""
    for line in node_sh(node, f"docker exec {container} ps -eo args").splitlines():
        words = line.split()
        if "serve" in words and any(w.endswith("vllm") for w in words[:words.index("serve")]):
            return words[words.index("serve"):]
    return []
