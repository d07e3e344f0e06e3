"""Messages to the user through the engine's gRPC Log service (pulumirpc.Engine), as providers send them.

The engine gives a plugin its own address as the last command-line argument (and again in Handshake and
Attach). The engine shows a plugin's stderr only in verbose logs, so what the user must see goes here. A
provider built on pulumi-go-provider sends `InfoStatus`-style messages as `Log(ephemeral=True)`: the engine shows
them on the resource's row while the step runs. Non-ephemeral messages are kept as the resource's diagnostics.
"""

import logging
import threading

import grpc
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc

INFO = engine_pb2.LogSeverity.INFO
WARNING = engine_pb2.LogSeverity.WARNING


class EngineLog:
    def __init__(self, address: str | None, log: logging.Logger, label: str, timeout_s: float,
                 undelivered_level: int):
        """`undelivered_level`: how loudly `log` reports a message the engine did not take; a double that also
        logs its messages locally can keep that quiet."""
        self.address = address
        self._log, self._label = log, label
        self._timeout_s, self._undelivered_level = timeout_s, undelivered_level
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
        self._log.debug("log %s %s: %s", engine_pb2.LogSeverity.Name(severity), urn, message)
        engine = self._engine()
        if engine is None:
            return
        try:
            engine.Log(engine_pb2.LogRequest(severity=severity, message=message, urn=urn, ephemeral=ephemeral),
                       timeout=self._timeout_s)
        except grpc.RpcError as err:  # the user loses a message, the operation goes on (as in the Go SDK)
            self._log.log(self._undelivered_level, "%s: could not send a log line to the engine at %s: %s",
                          self._label, self.address, err.details() if hasattr(err, "details") else err)
