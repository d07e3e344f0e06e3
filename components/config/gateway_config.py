"""A gateway stack's config: one OpenAI-compatible endpoint in front of several model stacks (docs/gateway.md).

A stack whose file sets `spark-vllm:gateway` is a gateway, and takes only these keys:
  spark-vllm:cluster      the catalog's cluster that holds its node (for SSH, as a model stack's)
  spark-vllm:catalog      the catalogs' folder, as for a model stack
  spark-vllm:gateway      {models: [model stacks], node: a node of the cluster, port: 4000, image, readySeconds}
  spark-vllm:gatewayKey   the one key every client sends (a secret)
  spark-vllm:preflight    {enabled: true}: the router's node checked before any change (components/preflight/gateway.py)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .schema import Section, did_you_mean
from .spec import NAMESPACE, ClusterSpec, NodeSpec

GATEWAY_KEY = "gatewayKey"
# The router: HAProxy 2.6 or newer (docs/gateway.md says why, and how the image is built).
DEFAULT_IMAGE = "spark-vllm/haproxy:2.6"
# A Pulumi stack name, or a fully qualified one (organization/project/stack).
STACK_NAME = re.compile(r"^([A-Za-z0-9_.-]+/){0,2}[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class GatewaySpec:
    stack: str
    cluster: ClusterSpec
    node: NodeSpec  # where the router runs; model stacks' APIs are reached from there over the fabric
    models: tuple[str, ...]  # the model stacks routed to, by stack name
    port: int
    image: str
    ready_timeout_s: int  # bound on the readiness gate: every route answering a completion
    ssh_private_key: Optional[str]
    preflight: bool = True  # the node checked, and the router's life read, before any change

    @property
    def endpoint_host(self) -> str:
        """Where clients reach the router's node."""
        return self.cluster.endpoint_of(self.node)


def is_gateway(config: Mapping[str, Any]) -> bool:
    return f"{NAMESPACE}:gateway" in config


@dataclass(frozen=True)
class GatewayKeys:
    catalog: str
    cluster: str
    models: tuple[str, ...]
    node: Optional[str]
    port: int
    image: str
    ready_timeout_s: int
    section: Section  # `spark-vllm:gateway`, for the node's error
    preflight: bool


def keys(top: Section, secret_keys: set[str]) -> GatewayKeys:
    """The gateway stack's own keys; `secret_keys` are those set with --secret."""
    cluster = top.str("cluster")
    catalog = top.str("catalog", "catalog")
    key = top.str(GATEWAY_KEY, accepted="a secret string: the key every client of the gateway sends")
    if f"{NAMESPACE}:{GATEWAY_KEY}" not in secret_keys:
        raise top.error(GATEWAY_KEY, key, f"a secret: run `pulumi config set --secret {NAMESPACE}:{GATEWAY_KEY} "
                                          "<value>`", "is stored in plain text")
    if key != key.strip():
        raise top.error(GATEWAY_KEY, key, "a value without them: HTTP drops them from a header",
                        "starts or ends with a space")
    gw = top.section("gateway", required=True)
    models = gw.str_list("models")
    if not models:
        raise gw.error("models", [], "a non-empty list of model stacks' names")
    for i, name in enumerate(models):
        if not STACK_NAME.match(name):
            raise gw.error(f"models[{i}]", name, "a stack name (letters, digits, '-', '_', '.'), or "
                                                 "organization/project/stack")
        if name in models[:i]:
            raise gw.error(f"models[{i}]", name, "each stack once", f"is {name!r}, which models[{models.index(name)}] "
                                                                    "names too")
    node = gw.str("node", None)
    port = gw.int("port", 4000, lo=1024, hi=65535)
    image = gw.image("image", DEFAULT_IMAGE)
    ready_s = gw.int("readySeconds", 300, lo=10, hi=3600)
    gw.done()
    checks = top.section("preflight")
    preflight = checks.bool("enabled", True)
    checks.done()
    unknown = top.unknown()
    if unknown:
        key, value = unknown[0], top.data[unknown[0]]
        raise top.error(key, value, f"only cluster, catalog, gateway, preflight and {GATEWAY_KEY} in a gateway stack "
                                    "(one that sets spark-vllm:gateway)",
                        f"({top.shown(key, value)!r}) is not a gateway's key")
    return GatewayKeys(catalog, cluster, models, node, port, image, ready_s, gw, preflight)


def place(cluster: ClusterSpec, keys: GatewayKeys) -> NodeSpec:
    """The gateway's node: `gateway.node`, or the cluster's head."""
    known = [n.name for n in cluster.nodes]
    if keys.node is None:
        return cluster.head
    if keys.node not in known:
        raise keys.section.error("node", keys.node, f"a node of cluster {cluster.name!r}: {', '.join(known)}",
                                 f"is {keys.node!r}" + did_you_mean(keys.node, known))
    return cluster.node(keys.node)
