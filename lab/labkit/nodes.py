"""Node containers: each one an emulated DGX Spark with sshd and its own dockerd."""
import re
import resource
import subprocess
from pathlib import Path

from . import model
from .config import (FABRIC_IFNAME, FABRIC_NET, INNER_IMAGE, LABEL, MGMT_GATEWAY, MGMT_IFNAME, MGMT_NET, PREFIX,
                     SPEC_LABEL, Node)
from .rootfs import hash_inputs
from .run import LabError, log, out, run, wait_until

# Nested dockerd without --privileged (which this host refuses), per notes/common.md, and a Spark-like
# /dev/shm for Ray's object store.
NODE_OPTS = [
    "--init", "--cgroupns", "private", "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm",
    "--shm-size", "8g",
    "--tmpfs", "/run/svl-lab",   # fresh at every start, so a ready marker can never be stale
]
# The ulimits of a Spark container (interfaces.md), so inner containers may ask for the same. Without
# CAP_SYS_RESOURCE nothing can rise above the host's hard limit, so each is capped there (and logged).
WANTED_ULIMITS = {"memlock": (resource.RLIMIT_MEMLOCK, -1), "nofile": (resource.RLIMIT_NOFILE, 1048576),
                  "stack": (resource.RLIMIT_STACK, 67108864)}
READY_TIMEOUT_S = 120


def ulimits() -> dict[str, int]:
    """Each wanted ulimit (-1 = unlimited), capped at this process's hard limit (dockerd's, on this host)."""
    capped = {}
    for name, (res, want) in WANTED_ULIMITS.items():
        hard = resource.getrlimit(res)[1]
        hard = -1 if hard == resource.RLIM_INFINITY else hard
        capped[name] = want if hard == -1 or (want != -1 and want <= hard) else hard
    return capped


def log_capped_ulimits() -> None:
    for name, value in ulimits().items():
        want = WANTED_ULIMITS[name][1]
        if value != want:
            log(f"ulimit {name}: host hard limit {value} < wanted {'unlimited' if want == -1 else want}; "
                f"nodes get {value}, so inner containers cannot ask for more")


def _create_args(node: Node, image: str, pubkey: str) -> list[str]:
    first_net = ["--network", MGMT_NET, "--ip", node.mgmt_ip] if node.mgmt_ip else \
                ["--network", FABRIC_NET, "--ip", node.fabric_ip]
    env = {"SVL_LAB_FABRIC_IP": node.fabric_ip, "SVL_LAB_MGMT_IP": node.mgmt_ip or "",
           "SVL_LAB_MGMT_GATEWAY": MGMT_GATEWAY, "SVL_LAB_AUTHORIZED_KEY": pubkey}
    limits = [a for k, v in ulimits().items() for a in ("--ulimit", f"{k}={v}:{v}")]
    return [*NODE_OPTS, *limits, "--name", node.name, "--hostname", node.name,
            "--mount", f"type=volume,source={node.volume},target=/var/lib/docker",
            *first_net, *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], image]


def _inspect(name: str, fmt: str) -> str | None:
    proc = run(["docker", "inspect", "-f", fmt, name], check=False, timeout=30)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_node(node: Node, image: str, pubkey: str) -> str:
    """Create, start or keep the node's container; returns what was done. A container created on the volume a
    removed one left (its images kept) starts with what its engine ran then: empty_engine clears that."""
    args = _create_args(node, image, pubkey)
    spec = hash_inputs(*args)
    state = _inspect(node.name, f'{{{{index .Config.Labels "{SPEC_LABEL}"}}}} {{{{.State.Running}}}}')
    if state == f"{spec} true":
        return "kept"
    if state and state.split()[0] == spec:
        run(["docker", "start", node.name], timeout=60)
        return "started"
    if state:
        run(["docker", "rm", "-f", node.name], timeout=60)
    kept_volume = _inspect(node.volume, "{{.Name}}") is not None
    if not kept_volume:
        run(["docker", "volume", "create", "--label", f"{LABEL}=1", node.volume])
    run(["docker", "create", "--label", f"{LABEL}=1", "--label", f"{SPEC_LABEL}={spec}", *args], timeout=60)
    if node.mgmt_ip:  # node1 is on both networks; docker attaches the second one before start
        run(["docker", "network", "connect", "--ip", node.fabric_ip, FABRIC_NET, node.name])
    run(["docker", "start", node.name], timeout=60)
    return ("created" if state is None else "recreated") + (KEPT_VOLUME if kept_volume else "")


KEPT_VOLUME = " on its kept volume"
# A node's engine as a new machine's would be, but for its images: the containers, volumes and networks that a
# removed node's engine left on its volume are removed.
_EMPTY_ENGINE = ("docker ps -aq | xargs -r docker rm -f >/dev/null && "
                 "docker volume ls -q | xargs -r docker volume rm -f >/dev/null && docker network prune -f >/dev/null")


def empty_engine(node: Node) -> None:
    run(["docker", "exec", node.name, "sh", "-c", _EMPTY_ENGINE], timeout=300)


def wait_ready(node: Node) -> None:
    def ready() -> bool:
        if _inspect(node.name, "{{.State.Running}}") != "true":
            logs = run(["docker", "logs", "--tail", "30", node.name], check=False).stderr
            raise LabError(f"{node.name} stopped while booting:\n{logs}")
        return run(["docker", "exec", node.name, "test", "-e", "/run/svl-lab/ready"], check=False).returncode == 0
    wait_until(ready, timeout=READY_TIMEOUT_S, what=f"{node.name} (dockerd + sshd)")


def restore_models(node: Node, image: str) -> str | None:
    """Puts the image's checkpoints back on a kept node whose /models a test or an interrupted run changed (a
    config.json moved away, a shard deleted); returns what differed, or None if nothing did."""
    found = model.parse_manifest(out(["docker", "exec", node.name, "find", model.MODELS_DIR, "-type", "f",
                                      "-exec", "sha256sum", "{}", "+"], timeout=120))
    want = model.parse_manifest(out(["docker", "exec", node.name, "cat", model.MANIFEST]))
    if found == want:
        return None
    differ = sorted({*found, *want} - {p for p in found if found[p] == want.get(p)})
    pristine = f"{node.name}-models"
    run(["docker", "rm", "-f", pristine], check=False, timeout=60)
    run(["docker", "create", "--name", pristine, image], timeout=60)
    try:
        tar = subprocess.Popen(["docker", "cp", f"{pristine}:{model.MODELS_DIR}", "-"], stdout=subprocess.PIPE)
        # In place, not removed and copied anew: an inner container may hold a checkpoint's folder mounted.
        run(["docker", "exec", "-i", node.name, "sh", "-c", 'tar -x -C / && rm -f -- "$@"', "sh",
             *sorted(found.keys() - want.keys())], stdin=tar.stdout, timeout=300)
        if tar.wait(timeout=60) != 0:
            raise LabError(f"docker cp {pristine}:{model.MODELS_DIR} failed ({tar.returncode})")
    finally:
        run(["docker", "rm", "-f", pristine], check=False, timeout=60)
    return ", ".join(differ)


def host_key(node: Node) -> str:
    return out(["docker", "exec", node.name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub"])


def existing_nodes() -> list[Node]:
    names = out(["docker", "ps", "-a", "--format", "{{.Names}}"]).split()
    return sorted((Node(int(m.group(1))) for n in names if (m := re.fullmatch(rf"{PREFIX}-node(\d+)", n))),
                  key=lambda n: n.index)


def remove_node(node: Node) -> None:
    """The node's container; its volume stays, with its images, for the next `up` that wants the node."""
    run(["docker", "rm", "-f", node.name], timeout=60)
    log(f"removed {node.name} (its volume {node.volume} stays)")


def memory(node: Node) -> str:
    """Memory of the node and all it runs, as `docker stats` counts it (usage less inactive page cache).

    Read from the cgroup v1 files because `docker stats` reports 0 for containers running their own dockerd.
    """
    cid = _inspect(node.name, "{{.Id}}")
    group = Path(f"/sys/fs/cgroup/memory/docker/{cid}")
    try:
        usage = int((group / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return "-"
    return f"{(usage - int(stat.get('total_inactive_file', 0))) / 2**20:.0f}MiB"


def facts(node: Node) -> dict[str, str]:
    """What `lab status` shows, read from inside the node (so renamed interfaces are checked too)."""
    def sh(cmd: str) -> str:
        proc = run(["docker", "exec", node.name, "sh", "-c", cmd], check=False, timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    addr = "ip -o -4 addr show dev {} 2>/dev/null | awk '{{print $4}}' | cut -d/ -f1"
    return {
        "fabric": sh(addr.format(FABRIC_IFNAME)) or "-",
        "mgmt": sh(addr.format(MGMT_IFNAME)) or "-",
        "dockerd": sh("docker version -f '{{.Server.Version}}'") or "down",
        "inner": sh(f"docker image inspect -f '{{{{.Id}}}}' {INNER_IMAGE}")[7:19] or "missing",
    }
