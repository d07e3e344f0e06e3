"""The lab commands: up, down, status, and a twin's up."""
import contextlib
import fcntl
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from . import images, model, network, nodes, ssh, twin
from .config import FABRIC_CIDR, GATEWAY_IMAGE, INNER_IMAGE, MP_IMAGE, PREFIX, STATE_DIR, nodes as lab_nodes
from .run import LabError, Phases, log, out, run, wait_until

TOOLS = ["docker", "debootstrap", "unshare", "nsenter", "chroot", "tar", "ip", "ssh", "ssh-keygen", "gcc"]
LOCK_TIMEOUT_S = 1800


def _parallel(fn, items):
    with ThreadPoolExecutor(max(1, len(items))) as pool:
        return list(pool.map(fn, items))


@contextlib.contextmanager
def _locked(name: str = "lock"):
    """One lab command at a time on this machine (tests and a developer may race): `lock` for the lab's nodes,
    `images.lock` for the host's images, which the twins copy while the lab's nodes come up."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / name, "w") as f:
        def acquired() -> bool:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
        if not acquired():
            log(f"another lab command holds {name}; waiting")
            wait_until(acquired, timeout=LOCK_TIMEOUT_S, what=f"the lab's {name}", interval=0.5)
        yield


def _preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("lab needs root (debootstrap, chroot, host routes)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)}")
    run(["docker", "info", "-f", "{{.ServerVersion}}"], timeout=30)


def _host_images(phase: Phases) -> tuple[str, str, str, str]:
    """The host's images, each built unless current: the node image's tag, then the inner, mp and gateway ids."""
    with phase("node image"):
        node_image = images.ensure_node_image()
    with phase("inner image"):
        inner_id = images.ensure_inner_image()
    with phase("mp image (no Ray)"):
        mp_id = images.ensure_mp_image()
    with phase("gateway image (HAProxy)"):
        gateway_id = images.ensure_gateway_image()
    return node_image, inner_id, mp_id, gateway_id


def up(count: int, gateway: bool = False, show_status: bool = True) -> None:
    """`gateway`: node1 gets the gateway's image too (HAProxy, 116 MB), which only the gateway stacks run.
    `show_status`: the node table at the end, for a reader (0.7 s: ssh and Docker again on every node)."""
    if count < 1:
        raise LabError("--nodes must be at least 1")
    phase = Phases()
    wanted = lab_nodes(count)
    with _locked("images.lock"):
        with phase("preflight"):
            _preflight()
            pubkey = ssh.ensure_key()
        node_image, inner_id, mp_id, gateway_id = _host_images(phase)
    with _locked():
        with phase("networks + host route"):
            network.ensure_networks()
            network.ensure_route()
        with phase("node containers"):
            nodes.log_capped_ulimits()
            for extra in [n for n in nodes.existing_nodes() if n.index > count]:
                nodes.remove_node(extra)
            done = {n: nodes.ensure_node(n, node_image, pubkey) for n in wanted}
            for n, what in done.items():
                log(f"{n.name}: {what}")
            _parallel(nodes.wait_ready, wanted)
            _parallel(nodes.empty_engine, [n for n, what in done.items() if what.endswith(nodes.KEPT_VOLUME)])
        with phase("models"):
            for n, differ in zip(wanted, _parallel(lambda n: nodes.restore_models(n, node_image), wanted)):
                if differ:
                    log(f"{n.name}: restored {model.MODELS_DIR} from the node image; these differed: {differ}")
        with phase("ssh"):
            ssh.write_known_hosts(dict(zip(wanted, _parallel(nodes.host_key, wanted))))
            ssh.write_config(wanted)
            _parallel(lambda n: run(ssh.ssh(n, "true"), timeout=30), wanted)
        with phase("inner image into nodes"):
            images.load_into_nodes(inner_id, wanted)
        with phase("mp image into nodes"):
            images.load_into_nodes(mp_id, wanted, MP_IMAGE, "mp")
        if gateway:
            with phase("gateway image into node1"):  # the lab's gateway stacks run the router there
                images.load_into_nodes(gateway_id, wanted[:1], GATEWAY_IMAGE, "gateway")
    phase.summary("lab up")
    print(f"\nssh: ssh -F {ssh.SSH_CONFIG} {PREFIX}-node1   (node2..N via node1 as jump host)")
    if show_status:
        status()


def twin_up(t: twin.Twin, count: int) -> None:
    """A twin (labkit/twin.py): the host's images made current and copied into it under the images' lock (not the
    nodes': the lab's own `up` may run beside it), then the twin's own `up`."""
    phase = Phases()
    with _locked("images.lock"):
        with phase("preflight"):
            _preflight()
        node_image = _host_images(phase)[0]
        with phase(f"{t.name}'s engine and images"):
            twin.ensure_engine(t, [node_image, INNER_IMAGE, MP_IMAGE, GATEWAY_IMAGE])
    with phase(f"{t.name}'s nodes"):
        twin.up(t, count)
    phase.summary(f"lab twin -n {t.index} up")


def _host_objects() -> dict[str, list[str]]:
    def names(kind: str) -> list[str]:
        listing = out(["docker", kind, "ls", "-a", "--format", "{{.Names}}"] if kind == "container"
                      else ["docker", kind, "ls", "--format", "{{.Name}}"])
        return [n for n in listing.split() if n.startswith(f"{PREFIX}-")]
    return {kind: names(kind) for kind in ("container", "network", "volume")}


def down() -> None:
    """Everything `up` made but the nodes' volumes: their engines' images stay, so that the next `up` loads none
    (it empties what else the engines held)."""
    phase = Phases()
    with _locked():
        objects = _host_objects()
        kept = [v for v in objects["volume"] if re.fullmatch(rf"{PREFIX}-node\d+-docker", v)]
        objects["volume"] = [v for v in objects["volume"] if v not in kept]
        with phase("containers"):
            if objects["container"]:
                run(["docker", "rm", "-f", *objects["container"]], timeout=180)
        with phase("networks"):
            for name in objects["network"]:
                run(["docker", "network", "rm", name], timeout=60)
        with phase("volumes"):
            if objects["volume"]:
                run(["docker", "volume", "rm", *objects["volume"]], timeout=300)
        with phase("host route + ssh files"):
            route = network.remove_route()
            ssh.remove_generated()
    removed = [f"{len(v)} {k}(s)" for k, v in objects.items() if v] + ([f"route {FABRIC_CIDR}"] if route else [])
    log("removed " + (", ".join(removed) if removed else "nothing (lab was already down)"))
    if kept:
        log(f"kept the nodes' volumes, with their images: {', '.join(kept)} (`docker volume rm` frees the space)")
    phase.summary("lab down")


def status() -> bool:
    """Print the node table; True when every node answers ssh and has the host's inner image."""
    existing = nodes.existing_nodes()
    if not existing:
        print("lab is down: no svl-lab node containers")
        return False
    want = images.image_id(INNER_IMAGE)

    def row(n):
        f = nodes.facts(n)
        sshd = ssh.SSH_CONFIG.exists() and run(ssh.ssh(n, "true"), check=False, timeout=30).returncode == 0
        return [n.name, f["mgmt"], f["fabric"], "ok" if sshd else "FAIL", f["dockerd"], f["inner"],
                nodes.memory(n)]

    t0 = time.monotonic()
    rows = _parallel(row, existing)
    head = ["node", "mgmt IP", "fabric IP", "sshd", "dockerd", "inner image", "mem"]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    route = "unreachable" if network.fabric_route_present() else "MISSING"
    print(f"host route {FABRIC_CIDR}: {route}; host image {INNER_IMAGE}: {want[7:19] if want else 'missing'}"
          f"  ({time.monotonic() - t0:.1f}s)")
    return route != "MISSING" and all(r[3] == "ok" and want and r[5] == want[7:19] for r in rows)
