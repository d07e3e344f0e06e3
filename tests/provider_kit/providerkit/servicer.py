"""The part of the pulumirpc.ResourceProvider service every double answers alike.

Plugin info (the version the double emulates), Handshake and Attach (which tell the double where the engine
is), Cancel (through the double's `cancel`), the Configure answer (secrets accepted, preview supported), and
UNIMPLEMENTED for the calls no double implements. A double subclasses `ProviderDouble` and decorates its own
methods with `rpc.method`.
"""

import logging

from google.protobuf import empty_pb2
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc

from . import rpc
from .engine_log import EngineLog


class ProviderDouble(provider_pb2_grpc.ResourceProviderServicer):
    LABEL: str                      # e.g. "docker test double": names the double in errors and warnings
    EMULATED_VERSION: str           # what GetPluginInfo reports: the version of the provider it stands in for
    EXPECTED_ERRORS: tuple[type[Exception], ...] = ()  # failed operations, reported with their message alone
    log: logging.Logger

    def __init__(self, engine: EngineLog):
        self.engine = engine

    def cancel(self) -> None:
        """The engine asked to stop what is running (Cancel RPC): a double ends its running operations."""
        raise NotImplementedError

    def warn(self, message: str, urn: str = "") -> None:
        """A warning about the double itself (an unknown call); goes to stderr."""
        self.log.warning("%s", message)

    @staticmethod
    def configured() -> provider_pb2.ConfigureResponse:
        return provider_pb2.ConfigureResponse(acceptSecrets=True, supportsPreview=True, acceptResources=True,
                                              acceptOutputs=False)

    @rpc.method
    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=self.EMULATED_VERSION)

    @rpc.method
    def Handshake(self, request, context):
        self.engine.retarget(request.engine_address)
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True,
                                                      accept_outputs=False)

    @rpc.method
    def Attach(self, request, context):
        self.engine.retarget(request.address)
        return empty_pb2.Empty()

    @rpc.method
    def Cancel(self, request, context):
        self.cancel()
        return empty_pb2.Empty()

    GetSchema = rpc.unimplemented("GetSchema")
    Parameterize = rpc.unimplemented("Parameterize")
    Invoke = rpc.unimplemented("Invoke")
    Call = rpc.unimplemented("Call")
    Construct = rpc.unimplemented("Construct")
    List = rpc.unimplemented("List")
    GetMapping = rpc.unimplemented("GetMapping")
    GetMappings = rpc.unimplemented("GetMappings")
