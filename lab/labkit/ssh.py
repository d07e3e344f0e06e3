"""The lab's SSH material in the state dir: key pair, known_hosts written from the nodes' real host keys
(no trust on first use needed), and an ssh_config with node aliases and node1 as jump host."""
from .config import FABRIC_CIDR, KNOWN_HOSTS, MGMT_CIDR, PREFIX, SSH_CONFIG, SSH_KEY, STATE_DIR, Node
from .run import run


def ensure_key() -> str:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not SSH_KEY.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "svl-lab", "-f", str(SSH_KEY)])
    return SSH_KEY.with_suffix(".pub").read_text().strip()


def _write(path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def write_known_hosts(host_keys: dict[Node, str]) -> None:
    lines = []
    for node, key in sorted(host_keys.items(), key=lambda kv: kv[0].index):
        algo, blob = key.split()[:2]
        names = ",".join(filter(None, [node.mgmt_ip, node.fabric_ip]))
        lines.append(f"{names} {algo} {blob}\n")
    _write(KNOWN_HOSTS, "".join(lines))


def write_config(nodes: list[Node]) -> None:
    """`ssh -F <state>/ssh_config svl-lab-node2` works; so does any fabric IP (via node1)."""
    jump = nodes[0]
    fabric, mgmt = (cidr.rsplit(".", 1)[0] + ".*" for cidr in (FABRIC_CIDR, MGMT_CIDR))  # /24 patterns
    blocks = ["# Written by lab/lab up.\n"]
    for n in nodes:
        blocks.append(f"Host {n.name}\n    HostName {n.mgmt_ip or n.fabric_ip}\n")
        if not n.mgmt_ip:
            blocks.append(f"    ProxyJump {jump.name}\n")
    blocks.append(f"Host {fabric}\n    ProxyJump {jump.name}\n")
    blocks.append(f"Host {PREFIX}-node* {mgmt} {fabric}\n"
                  f"    User root\n"
                  f"    IdentityFile {SSH_KEY}\n"
                  f"    IdentitiesOnly yes\n"
                  f"    UserKnownHostsFile {KNOWN_HOSTS}\n"
                  f"    StrictHostKeyChecking accept-new\n"
                  f"    BatchMode yes\n"
                  f"    ConnectTimeout 10\n")
    _write(SSH_CONFIG, "".join(blocks))


def ssh(node: Node, *command: str) -> list[str]:
    return ["ssh", "-F", str(SSH_CONFIG), node.name, *command]


def remove_generated() -> None:
    for path in (KNOWN_HOSTS, SSH_CONFIG):
        path.unlink(missing_ok=True)
