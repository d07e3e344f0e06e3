"""The plugin process: serve a provider on a free localhost port and print that port, as Pulumi plugins must.

The engine starts a plugin as `pulumi-resource-<name> [flags] <engine address>` and reads the port from the
first line of stdout. Warnings go to stderr (the engine keeps it in its verbose logs); with the double's log
variable set to a file, every call is logged there at DEBUG.
"""

import logging
import os
import signal
import sys
from concurrent import futures

import grpc
from pulumi.runtime.proto import provider_pb2_grpc

from .rpc import UnknownCalls
from .servicer import ProviderDouble

MAX_MESSAGE_BYTES = 400 * 1024 * 1024  # the engine's own limit for provider messages


def engine_address(argv: list[str]) -> str | None:
    # The engine passes flags of its own (--logtostderr, -v=N, --tracing ...) before its address.
    return next((arg for arg in reversed(argv[1:]) if not arg.startswith("-")), None)


def setup_logging(name: str, file_variable: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.DEBUG)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(logging.WARNING)
    log.addHandler(stderr)
    path = os.environ.get(file_variable)
    if path:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
        log.addHandler(handler)
    return log


def serve(servicer: ProviderDouble, on_signal=None) -> None:
    """Serves until SIGTERM/SIGINT; `on_signal()` runs first, before in-flight calls get their grace period."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((UnknownCalls(servicer.LABEL, servicer.warn),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()

    def stop(signum, frame):
        if on_signal is not None:
            on_signal()
        server.stop(grace=2)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()
