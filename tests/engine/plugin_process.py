"""A provider double started the way the engine starts a plugin, talked to with a pulumirpc stub."""

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from pulumi.runtime.proto import provider_pb2_grpc

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "provider_kit"))
from providerkit import values  # noqa: E402,F401  (the doubles' own Struct encoding, for the tests)


class PluginProcess:
    def __init__(self, argv: list[str], env: dict[str, str]):
        """`argv`: the launcher and the engine's arguments; `env`: added to this process's environment."""
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, **env))
        port = int(self.proc.stdout.readline())  # a plugin's first line of output is its port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)

    def close(self) -> str:
        """Stops the plugin; returns what it wrote on stderr."""
        self.channel.close()
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return err.decode(errors="replace")


def rpc_error(call) -> str:
    """The details of the gRPC error `call()` must raise."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.details()
