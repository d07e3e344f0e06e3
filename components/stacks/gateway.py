"""A gateway stack: the router's node, and the gateway on it (docs/gateway.md)."""

import pulumi

from ..config.gateway_config import GATEWAY_KEY, GatewaySpec
from ..preflight import gateway as preflight
from ..config.spec import NAMESPACE
from ..resources.gateway import Gateway, GatewayArgs
from ..resources.spark_node import SparkNode, SparkNodeArgs


def wire(spec: GatewaySpec) -> None:
    cluster, node = spec.cluster, spec.node
    life = preflight.run(spec)  # before any resource: a failed check leaves the stack as it was
    private_key = pulumi.Output.secret(spec.ssh_private_key) if spec.ssh_private_key else None
    spark = SparkNode(node.name, SparkNodeArgs(node=node, ssh=cluster.ssh, image=spec.image,
                                               jump=cluster.node(node.via) if node.via else None,
                                               private_key=private_key))
    gateway = Gateway("gateway", GatewayArgs(spec=spec, spark=spark,
                                             gateway_key=pulumi.Config(NAMESPACE).require_secret(GATEWAY_KEY),
                                             life=life.token))
    # Exported once every route answers through it, as a model stack's baseUrl is.
    pulumi.export("baseUrl", gateway.ready_id.apply(lambda _: f"http://{spec.endpoint_host}:{spec.port}/v1"))
    pulumi.export("routes", gateway.routes)
    pulumi.export("models", list(spec.models))
    pulumi.export("routerConfig", gateway.config)  # the digest the router's liveness answer names
