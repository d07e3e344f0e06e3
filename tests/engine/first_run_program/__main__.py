"""Smallest program shaped like spark-vllm's: a docker provider over ssh to one node, an image that must
already be there, a container from it, and a remote command on the same node."""

from pathlib import Path

import pulumi
import pulumi_command as command
import pulumi_docker as docker

cfg = pulumi.Config()
port = cfg.require_int("sshPort")
key_path = cfg.require("keyPath")

node = docker.Provider("node", host=f"ssh://root@127.0.0.1:{port}", ssh_opts=[
    "-i", key_path, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"])
on_node = pulumi.ResourceOptions(provider=node)

image = docker.RemoteImage("busybox", name=cfg.require("image"), keep_locally=True, opts=on_node)
sleeper = docker.Container("sleeper", name=cfg.require("containerName"), image=image.image_id,
                           command=["sleep", "3600"], envs=[f"MODE={cfg.require('mode')}"],
                           labels=[docker.ContainerLabelArgs(label="svl.test", value="first-run")],
                           restart="no", opts=on_node)

marker = cfg.require("markerPath")
touch = command.remote.Command(
    "marker",
    connection=command.remote.ConnectionArgs(host="127.0.0.1", port=port, user="root",
                                             private_key=pulumi.Output.secret(Path(key_path).read_text())),
    create=f"echo ran-on-node > {marker} && cat {marker}",
    delete=f"rm -f {marker}")

pulumi.export("containerId", sleeper.id)
pulumi.export("imageId", image.image_id)
pulumi.export("markerStdout", touch.stdout)
