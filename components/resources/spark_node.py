"""One DGX Spark: a Docker provider over SSH, the matching remote-command connection, and the image on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from ..config.spec import NodeSpec, SshSpec
from ..nodes.node_runner import ensure_control_dir, provider_ssh_opts


def connection(node: NodeSpec, jump: Optional[NodeSpec],
               private_key: Optional[pulumi.Input[str]]) -> command.remote.ConnectionArgs:
    """How a remote command reaches `node`: through `jump` when it is set, with the cluster's key (a secret)."""
    proxy = None
    if jump is not None:
        proxy = command.remote.ProxyConnectionArgs(host=jump.ssh_host, port=jump.ssh_port, user=jump.ssh_user,
                                                   private_key=private_key)
    return command.remote.ConnectionArgs(host=node.ssh_host, port=node.ssh_port, user=node.ssh_user,
                                         private_key=private_key, proxy=proxy)


@dataclass
class SparkNodeArgs:
    node: NodeSpec
    ssh: SshSpec
    image: str
    jump: Optional[NodeSpec] = None  # the node to hop through, when `node.via` is set
    private_key: Optional[pulumi.Input[str]] = None  # a secret; None uses the ssh agent
    image_found: Optional[str] = None  # the id the node holds, or will once its image arrives; None: not known
    image_ready: Optional[pulumi.CustomResource] = None  # what brings the image to the node (image_transfer.py)


class SparkNode(pulumi.ComponentResource):
    """A Spark reached over SSH: `provider` runs containers on it, `connection` runs commands on it."""

    provider: docker.Provider
    connection: command.remote.ConnectionArgs
    image: docker.RemoteImage
    image_id: pulumi.Output[str]

    def __init__(self, name: str, args: SparkNodeArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:SparkNode", name, None, opts)
        node, jump = args.node, args.jump
        port = "" if node.ssh_port == 22 else f":{node.ssh_port}"
        self.host = f"ssh://{node.ssh_user}@{node.ssh_host}{port}"
        ensure_control_dir(args.ssh)  # the provider's ssh does not create its sockets' folder
        self.provider = docker.Provider(f"{name}-docker", host=self.host,
                                        ssh_opts=provider_ssh_opts(args.ssh, jump),
                                        opts=pulumi.ResourceOptions(parent=self))
        self.connection = connection(node, jump, args.private_key)
        # Its id, not its tag, feeds the containers: a new image under the same tag replaces them. pulumi-docker
        # reads the id again only on refresh, so the id preflight just read on the node comes first. It is read
        # again once the image arrives: after the node's copy or pull, which it follows.
        ready = args.image_ready
        image = docker.RemoteImage(f"{name}-image", name=args.image, keep_locally=True,
                                   opts=pulumi.ResourceOptions(parent=self, provider=self.provider,
                                                               depends_on=[ready] if ready else None,
                                                               replacement_trigger=ready.id if ready else None))
        # A known id stays known in a preview, where a replaced RemoteImage's is not: the containers would show a
        # replacement that never comes. What runs on the node depends on `image` for the order.
        self.image = image
        self.image_id = pulumi.Output.from_input(args.image_found) if args.image_found else image.image_id
        self.register_outputs({"host": self.host, "imageId": self.image_id})
