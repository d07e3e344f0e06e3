"""Starts a pulumi-command plugin (the double, or the binary named by SPARK_VLLM_COMMAND_PLUGIN) the way the
engine does, with a fake engine that receives its Log calls, and talks to it with a pulumirpc stub."""

import os
import time
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc, provider_pb2

from plugin_process import TESTS, PluginProcess, values

DOUBLE = TESTS / "command_double" / "pulumi-resource-command"
# The plugin under test: the double by default; the real binary for a check by hand (docs/real-plugins.md).
PLUGIN = Path(os.environ.get("SPARK_VLLM_COMMAND_PLUGIN") or DOUBLE)

TOKEN = "command:remote:Command"
KIND = provider_pb2.PropertyDiff
INFO, WARNING = engine_pb2.LogSeverity.INFO, engine_pb2.LogSeverity.WARNING


def urn(name: str, token: str = TOKEN) -> str:
    return f"urn:pulumi:test::spark-vllm::{token}::{name}"


class FakeEngine(engine_pb2_grpc.EngineServicer):
    """Receives the plugin's Log calls, stamped with their arrival time."""

    def __init__(self):
        self.logs: list[tuple[float, engine_pb2.LogRequest]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        engine_pb2_grpc.add_EngineServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def Log(self, request, context):
        self.logs.append((time.monotonic(), request))
        return empty_pb2.Empty()

    def messages(self, name: str, ephemeral: bool = True) -> list[str]:
        return [r.message for _, r in self.logs if r.urn == urn(name) and r.ephemeral == ephemeral]


class CommandPlugin(PluginProcess):
    """Starts a plugin the way the engine does (`pulumi-resource-command <engine address>`)."""

    def __init__(self, engine_address: str, log_path: Path, launcher: Path = DOUBLE):
        super().__init__([str(launcher), engine_address], {"SPARK_VLLM_COMMAND_DOUBLE_LOG": str(log_path)})

    def check(self, news: dict, name: str = "gate", token: str = TOKEN):
        return self.stub.Check(provider_pb2.CheckRequest(urn=urn(name, token), news=values.encode(news)))

    def checked(self, news: dict, name: str = "gate") -> dict:
        response = self.check(news, name)
        assert not response.failures, response.failures
        return values.decode(response.inputs)

    def create(self, inputs: dict, name: str = "gate", preview: bool = False) -> tuple[str, dict]:
        response = self.stub.Create(provider_pb2.CreateRequest(urn=urn(name), properties=values.encode(inputs),
                                                               preview=preview))
        return response.id, values.decode(response.properties)

    def diff(self, olds: dict, news: dict, name: str = "gate"):
        return self.stub.Diff(provider_pb2.DiffRequest(urn=urn(name), id=f"{name}0", olds=values.encode(olds),
                                                       news=values.encode(news)))

    def update(self, olds: dict, news: dict, name: str = "gate", preview: bool = False) -> dict:
        response = self.stub.Update(provider_pb2.UpdateRequest(urn=urn(name), id=f"{name}0", olds=values.encode(olds),
                                                               news=values.encode(news), preview=preview))
        return values.decode(response.properties)

    def delete(self, state: dict, name: str = "gate") -> None:
        self.stub.Delete(provider_pb2.DeleteRequest(urn=urn(name), id=f"{name}0", properties=values.encode(state)))


def conn(node, **extra) -> dict:
    """A connection as the pulumi_command SDK sends it: the whole object is a secret."""
    return values.secret({"host": "127.0.0.1", "port": node.port, "user": "root",
                          "privateKey": node.key.read_text(), **extra})
