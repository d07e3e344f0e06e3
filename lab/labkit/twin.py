"""The lab's twins: more labs with the same node names, addresses and catalog entries, each in a network namespace
and a Docker engine of its own, so that more streams of tests run beside the lab's (scripts/test).

What runs in a twin (`lab/lab twin run CMD`) is in the twin's network namespace, and sees through a mount namespace of
its own the twin's engine at /run/docker.sock, the twin's state folder (SSH key, known_hosts, ssh_config) in place of
the lab's, and the twin's folder for the program's SSH control sockets. So lab/lab, the tests and the program run
there unchanged. The twin's images are the host's, copied (same ids), never built there: its namespace has no route
out of the machine.
"""
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import images
from .config import LAB_SRC, PREFIX, STATE_DIR
from .run import LabError, log, ok, run, wait_until

# The program's SSH control sockets (components/nodes/node_runner.py) are named from the address, which every lab
# shares: each needs its own folder of them, or one lab's commands would reach another's nodes.
CONTROL_DIR = Path.home() / ".cache/spark-vllm/ssh"


@dataclass(frozen=True)
class Twin:
    index: int  # 1, 2, ...: each runs one stream of tests

    @property
    def name(self) -> str:
        return f"{PREFIX}-twin{self.index}"

    @property
    def netns(self) -> Path:
        return Path("/run/netns") / self.name

    @property
    def data_root(self) -> Path:  # its engine's images: kept across `twin down`, so they are copied once
        return Path("/var/lib") / self.name

    @property
    def run_dir(self) -> Path:  # its engine's exec root, pid file, socket and log
        return Path("/run") / self.name

    @property
    def socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def state(self) -> Path:
        return STATE_DIR.with_name(f"{STATE_DIR.name}-twin{self.index}")

    @property
    def docker_env(self) -> list[str]:  # a prefix for docker commands on its engine
        return ["env", f"DOCKER_HOST=unix://{self.socket}"]


# Run in the twin's mount namespace before the command. The mounts copied from the host's namespace that belong to
# the Docker engines (their containers' network namespaces and root filesystems) are dropped first: a copy would
# keep a restarted node's old network namespace alive, with its address, beside the new one.
_ENTER = """
engines='(docker|{prefix}-twin[0-9]+)'
awk -v re="^/(var/)?run/$engines|^/var/lib/$engines/" '$5 ~ re {{print $5}}' /proc/self/mountinfo |
  sort -r | xargs -r -n1 umount -l
mount --bind "{cache}" "{state}/cache"
mount --bind "{state}/ssh" "{control}"
mount --rbind "{state}" "{state_dir}"
mount --bind "{socket}" /run/docker.sock
exec "$@"
"""


def _engine_answers(t: Twin) -> bool:
    return ok([*t.docker_env, "docker", "info"], timeout=30)


def _start_engine(t: Twin) -> None:
    if not t.netns.exists():
        run(["ip", "netns", "add", t.name])
    run(["ip", "-n", t.name, "link", "set", "lo", "up"])
    if _engine_answers(t):
        return
    t.run_dir.mkdir(parents=True, exist_ok=True)
    # nsenter, not `ip netns exec`: that one mounts a new /sys, which hides the cgroups the engine needs.
    with open(t.run_dir / "dockerd.log", "ab") as logf:
        subprocess.Popen(["nsenter", f"--net={t.netns}", "dockerd", "--data-root", str(t.data_root),
                          "--exec-root", str(t.run_dir / "exec"), "--pidfile", str(t.run_dir / "dockerd.pid"),
                          "-H", f"unix://{t.socket}"], stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                         start_new_session=True)
    wait_until(lambda: _engine_answers(t), timeout=60,
               what=f"{t.name}'s Docker engine (log: {t.run_dir / 'dockerd.log'})")
    log(f"{t.name}'s engine: {t.socket} in network namespace {t.name}")


def _copy_images(t: Twin, refs: list[str]) -> None:
    """The host's images into the twin's engine, each unless it already has the same id."""
    missing = [ref for ref in refs if images.image_id(ref) != images.image_id(ref, t.docker_env)]
    if not missing:
        return
    save = subprocess.Popen(["docker", "save", *missing], stdout=subprocess.PIPE)
    try:
        run([*t.docker_env, "docker", "load", "-q"], stdin=save.stdout, timeout=900)
    finally:
        save.stdout.close()
        if save.wait(timeout=60) != 0:
            raise LabError(f"docker save {' '.join(missing)} failed")
    log(f"copied into {t.name}: {', '.join(missing)}")


def enter(t: Twin, argv: list[str]) -> list[str]:
    """The command line that runs argv in twin `t`."""
    script = _ENTER.format(prefix=PREFIX, cache=STATE_DIR / "cache", state=t.state, control=CONTROL_DIR,
                           state_dir=STATE_DIR, socket=t.socket)
    return ["nsenter", f"--net={t.netns}", "unshare", "--mount", "--propagation", "private",
            "env", "-u", "DOCKER_HOST", "sh", "-ec", script, "twin", *argv]


def ensure_engine(t: Twin, host_images: list[str]) -> None:
    """The twin's engine running, with the host's current images (`host_images`) in it."""
    _start_engine(t)
    _copy_images(t, host_images)


def up(t: Twin, count: int) -> None:
    """`lab up` in the twin."""
    for folder in (t.state / "cache", t.state / "ssh", CONTROL_DIR, STATE_DIR / "cache"):
        folder.mkdir(parents=True, exist_ok=True)
    run(enter(t, [str(LAB_SRC / "lab"), "up", "--nodes", str(count)]), stdout=None, stderr=None, timeout=1800)


def down(t: Twin) -> None:
    """The twin's nodes and networks, then its engine and network namespace; its images stay for the next `up`."""
    if t.netns.exists() and _engine_answers(t):
        run(enter(t, [str(LAB_SRC / "lab"), "down"]), stdout=None, stderr=None, timeout=900)
    pidfile = t.run_dir / "dockerd.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=60, what="the twin's engine to stop")
        except ProcessLookupError:
            pass
    if t.netns.exists():
        run(["ip", "netns", "del", t.name])
    log(f"{t.name} down")

