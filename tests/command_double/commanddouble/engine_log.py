"""Messages to the user through the engine's gRPC Log service (pulumirpc.Engine), as providers send them.

The engine gives a plugin its own address as the last command-line argument (and again in Handshake). A
provider built on pulumi-go-provider sends `InfoStatus`-style messages as `Log(ephemeral=True)`: the engine shows
them on the resource's row while the step runs, which is how command output streams live. Non-ephemeral
messages are kept as the resource's diagnostics.
"""

import logging
import threading

import grpc
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc

log = logging.getLogger("command-double")

INFO = engine_pb2.LogSeverity.INFO
WARNING = engine_pb2.LogSeverity.WARNING
SEND_TIMEOUT_S = 30


class EngineLog:
    def __init__(self, address: str | None):
        self.address = address
        self._stub = None
        self._lock = threading.Lock()

    def retarget(self, address: str | None) -> None:
        with self._lock:
            if address and address != self.address:
                self.address, self._stub = address, None

    def _engine(self):
        with self._lock:
            if self._stub is None and self.address:
                self._stub = engine_pb2_grpc.EngineStub(grpc.insecure_channel(self.address))
            return self._stub

    def send(self, urn: str, message: str, severity=INFO, ephemeral: bool = True) -> None:
        log.debug("log %s %s: %s", engine_pb2.LogSeverity.Name(severity), urn, message)
        engine = self._engine()
        if engine is None:
            return
        try:
            engine.Log(engine_pb2.LogRequest(severity=severity, message=message, urn=urn, ephemeral=ephemeral),
                       timeout=SEND_TIMEOUT_S)
        except grpc.RpcError as err:  # the user loses a line, the operation goes on (as in the Go SDK)
            log.warning("command test double: could not send a log line to the engine at %s: %s",
                        self.address, err.details() if hasattr(err, "details") else err)
