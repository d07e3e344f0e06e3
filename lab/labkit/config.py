"""Names, addresses and paths of the lab, as fixed by docs/interfaces (notes/interfaces.md)."""
import os
from dataclasses import dataclass
from pathlib import Path

LAB_SRC = Path(__file__).resolve().parent.parent          # the lab/ folder
STATE_DIR = Path(os.environ.get("SPARK_VLLM_LAB_DIR") or Path.home() / ".cache/spark-vllm/lab")
CACHE_DIR = STATE_DIR / "cache"                            # rootfs tarballs, .debs, pip cache
SSH_KEY = STATE_DIR / "id_ed25519"
KNOWN_HOSTS = STATE_DIR / "known_hosts"
SSH_CONFIG = STATE_DIR / "ssh_config"

PREFIX = "svl-lab"                                         # every host docker object starts with it
LABEL = "svl-lab"                                          # label key on every host docker object
SPEC_LABEL = "svl-lab.spec"                                # hash of the settings an object was made with

MGMT_NET = f"{PREFIX}-mgmt"
MGMT_CIDR = "172.29.87.0/24"
MGMT_GATEWAY = "172.29.87.1"                               # the host ("workstation") on the mgmt LAN
FABRIC_NET = f"{PREFIX}-fabric"
FABRIC_CIDR = "10.87.200.0/24"
FABRIC_GATEWAY = "10.87.200.1"                             # reserved by docker, never assigned (inhibit_ipv4)
FABRIC_MTU = 9000                                          # as the Spark's ConnectX-7 halves

FABRIC_IFNAME = "enp1s0f1np1"
MGMT_IFNAME = "enP7s7"

NODE_IMAGE_REPO = f"{PREFIX}/node"
INNER_IMAGE = "spark-vllm-lab/ray-vllm:2.60.0-double1"
# The same double without Ray, as NGC vLLM images from 26.04 on: for the `mp` executor across nodes.
MP_IMAGE = "spark-vllm-lab/vllm-mp:double1"
RAY_VERSION = "2.60.0"
# The Hub's client, which vLLM images carry: the program's Hub download runs in the model's image (docs/artifacts.md).
HUGGINGFACE_HUB = "huggingface_hub==2.4.0"
# The lab's image registry (lab/labkit/services.py) on the management LAN, as a site's or NGC's is: node1 reaches it,
# node2 only through node1. Plain HTTP, which the nodes' engines allow it (lab/node/daemon.json), with a login.
REGISTRY = "172.29.87.1:5000"
# The Hub double (lab/hub_double) on the management LAN.
HUB_URL = "http://172.29.87.1:18180"
# The gateway's router: HAProxy from the Debian release the lab's images are built on (docs/gateway.md), as the image
# docs/gateway.md builds for a Spark.
GATEWAY_IMAGE = "spark-vllm-lab/haproxy:2.6"
GATEWAY_PACKAGES = ["haproxy"]
VLLM_DOUBLE_DIR = LAB_SRC / "vllm_double"

DEBIAN_SUITE = "bookworm"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class Node:
    index: int                                              # 1-based, as in interfaces.md

    @property
    def name(self) -> str:
        return f"{PREFIX}-node{self.index}"

    @property
    def volume(self) -> str:
        return f"{PREFIX}-node{self.index}-docker"

    @property
    def fabric_ip(self) -> str:
        return f"10.87.200.{10 + self.index}"

    @property
    def mgmt_ip(self) -> str | None:
        return "172.29.87.11" if self.index == 1 else None  # only node1 is on the mgmt LAN


def nodes(count: int) -> list[Node]:
    return [Node(i) for i in range(1, count + 1)]
