"""One DGX Spark: a Docker provider over SSH, the matching remote-command connection, and the image on it."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from .config import NodeSpec, SshSpec


@dataclass
class SparkNodeArgs:
    node: NodeSpec
    ssh: SshSpec
    image: str
    jump: Optional[NodeSpec] = None  # the node to hop through, when `node.via` is set
    private_key: Optional[pulumi.Input[str]] = None  # a secret; None uses the ssh agent


# `~` is expanded by ssh itself, so the provider's inputs are the same on every workstation.
CONTROL_DIR = "~/.cache/spark-vllm/ssh"


def ssh_options(ssh: SshSpec) -> list[str]:
    """Options for the local `ssh` binary, which pulumi-docker runs to reach a node's Docker daemon."""
    opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
            "-o", f"StrictHostKeyChecking={ssh.strict_host_key_checking}"]
    if ssh.control_persist_s:
        # pulumi-docker runs one ssh per Docker API connection; one shared connection a node (and hop) saves
        # a key exchange each time. ssh does not create the socket's folder; it must be private.
        os.makedirs(os.path.expanduser(CONTROL_DIR), mode=0o700, exist_ok=True)
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={CONTROL_DIR}/%C",
                 "-o", f"ControlPersist={ssh.control_persist_s}"]
    if ssh.known_hosts_file:
        opts += ["-o", f"UserKnownHostsFile={ssh.known_hosts_file}"]
    if ssh.key_file:
        opts += ["-o", "IdentitiesOnly=yes", "-i", ssh.key_file]
    return opts


def docker_ssh_opts(ssh: SshSpec, jump: Optional[NodeSpec]) -> list[str]:
    opts = ssh_options(ssh)
    if jump is not None:
        # A ProxyCommand carries every option to the jump hop too; `ssh -J` would drop the -o options there.
        # ssh expands %-tokens in a ProxyCommand: the hop's own tokens (%C) must reach it as written.
        hop = ["ssh", *(o.replace("%", "%%") for o in opts), "-p", str(jump.ssh_port), "-W", "%h:%p",
               f"{jump.ssh_user}@{jump.ssh_host}"]
        opts += ["-o", "ProxyCommand=" + shlex.join(hop)]
    return opts


def ssh_argv(ssh: SshSpec, node: NodeSpec, jump: Optional[NodeSpec], command: str) -> list[str]:
    """The local `ssh` command line that runs `command` on `node`, as the Docker provider reaches it."""
    return ["ssh", *docker_ssh_opts(ssh, jump), "-p", str(node.ssh_port), f"{node.ssh_user}@{node.ssh_host}",
            "--", command]


class SparkNode(pulumi.ComponentResource):
    """A Spark reached over SSH: `provider` runs containers on it, `connection` runs commands on it."""

    provider: docker.Provider
    connection: command.remote.ConnectionArgs
    image_id: pulumi.Output[str]

    def __init__(self, name: str, args: SparkNodeArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("spark-vllm:index:SparkNode", name, None, opts)
        node, jump = args.node, args.jump
        port = "" if node.ssh_port == 22 else f":{node.ssh_port}"
        self.host = f"ssh://{node.ssh_user}@{node.ssh_host}{port}"
        self.provider = docker.Provider(f"{name}-docker", host=self.host,
                                        ssh_opts=docker_ssh_opts(args.ssh, jump),
                                        opts=pulumi.ResourceOptions(parent=self))
        proxy = None
        if jump is not None:
            proxy = command.remote.ProxyConnectionArgs(host=jump.ssh_host, port=jump.ssh_port, user=jump.ssh_user,
                                                       private_key=args.private_key)
        self.connection = command.remote.ConnectionArgs(host=node.ssh_host, port=node.ssh_port, user=node.ssh_user,
                                                        private_key=args.private_key, proxy=proxy)
        # Its id, not its tag, feeds the containers: a new image under the same tag replaces them.
        image = docker.RemoteImage(f"{name}-image", name=args.image, keep_locally=True,
                                   opts=pulumi.ResourceOptions(parent=self, provider=self.provider))
        self.image_id = image.image_id
        self.register_outputs({"host": self.host, "imageId": self.image_id})
