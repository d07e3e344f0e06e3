"""Starts a pulumi-docker plugin (the double, or the binary named by SPARK_VLLM_DOCKER_PLUGIN) the way the
engine does, and talks to it with a pulumirpc stub."""

import json
import os
from pathlib import Path

from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2

from plugin_process import TESTS, PluginProcess, values

DOUBLE_DIR = TESTS / "docker_double"
DOUBLE = DOUBLE_DIR / "pulumi-resource-docker"
# The plugin under test: the double by default; the real binary for a check by hand (docs/real-plugins.md).
PLUGIN = Path(os.environ.get("SPARK_VLLM_DOCKER_PLUGIN") or DOUBLE)
CONTAINER = "docker:index/container:Container"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
PROVIDER = "pulumi:providers:docker"


def urn(token: str, name: str) -> str:
    return f"urn:pulumi:test::spark-vllm::{token}::{name}"


class DoublePlugin(PluginProcess):
    def __init__(self, log_path: Path, launcher: Path = DOUBLE, engine_address: str = "127.0.0.1:1"):
        super().__init__([str(launcher), engine_address], {"SPARK_VLLM_DOCKER_DOUBLE_LOG": str(log_path)})

    def info(self):
        return self.stub.GetPluginInfo(empty_pb2.Empty())

    def configure(self, host: str, ssh_opts: list[str]):
        # As the pulumi_docker SDK sends it: sshOpts JSON-encoded into a string.
        args = {"host": host, "sshOpts": json.dumps(ssh_opts), "version": "5.2.0"}
        checked = self.stub.CheckConfig(provider_pb2.CheckRequest(urn=urn(PROVIDER, "node"),
                                                                  news=values.encode(args)))
        assert not checked.failures, checked.failures
        return self.stub.Configure(provider_pb2.ConfigureRequest(args=checked.inputs, acceptSecrets=True,
                                                                 acceptResources=True))

    def check(self, token: str, news: dict, name: str = "r"):
        return self.stub.Check(provider_pb2.CheckRequest(urn=urn(token, name), news=values.encode(news)))

    def checked(self, token: str, news: dict, name: str = "r") -> dict:
        response = self.check(token, news, name)
        assert not response.failures, response.failures
        return values.decode(response.inputs)

    def create(self, token: str, inputs: dict, name: str = "r", preview: bool = False) -> tuple[str, dict]:
        response = self.stub.Create(provider_pb2.CreateRequest(urn=urn(token, name), properties=values.encode(inputs),
                                                               preview=preview))
        return response.id, values.decode(response.properties)

    def read(self, token: str, rid: str, state: dict, inputs: dict, name: str = "r") -> tuple[str, dict, dict]:
        response = self.stub.Read(provider_pb2.ReadRequest(urn=urn(token, name), id=rid,
                                                           properties=values.encode(state),
                                                           inputs=values.encode(inputs)))
        return response.id, values.decode(response.properties), values.decode(response.inputs)

    def diff(self, token: str, rid: str, olds: dict, news: dict, name: str = "r"):
        return self.stub.Diff(provider_pb2.DiffRequest(urn=urn(token, name), id=rid, olds=values.encode(olds),
                                                       news=values.encode(news)))

    def update(self, token: str, rid: str, olds: dict, news: dict, name: str = "r") -> dict:
        response = self.stub.Update(provider_pb2.UpdateRequest(urn=urn(token, name), id=rid,
                                                               olds=values.encode(olds), news=values.encode(news)))
        return values.decode(response.properties)

    def delete(self, token: str, rid: str, state: dict, name: str = "r") -> None:
        self.stub.Delete(provider_pb2.DeleteRequest(urn=urn(token, name), id=rid, properties=values.encode(state)))
