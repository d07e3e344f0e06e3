"""Warnings shown in the Pulumi CLI output.

The engine shows a plugin's stderr only in verbose logs, so, as real providers do, warnings are sent to the
engine's Log service (pulumirpc.Engine) at the address the engine passed; they also go to the local log.
"""

import logging
import threading

import grpc
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc

log = logging.getLogger("docker-double")
SEND_TIMEOUT_S = 5


class EngineLog:
    def __init__(self, address: str | None):
        self._lock = threading.Lock()
        self._address = address
        self._stub = None

    def attach(self, address: str) -> None:
        with self._lock:
            if address and address != self._address:
                self._address, self._stub = address, None

    def warn(self, message: str, urn: str = "") -> None:
        log.warning("%s", message)
        with self._lock:
            if self._stub is None and self._address:
                self._stub = engine_pb2_grpc.EngineStub(grpc.insecure_channel(self._address))
            stub = self._stub
        if stub is None:
            return
        try:
            stub.Log(engine_pb2.LogRequest(severity=engine_pb2.WARNING, message=message, urn=urn),
                     timeout=SEND_TIMEOUT_S)
        except grpc.RpcError as err:
            log.debug("engine log at %s unavailable: %s", self._address, err.code())
