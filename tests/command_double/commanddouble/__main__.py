"""Entry point: serve the provider on a free localhost port and print that port, as Pulumi plugins must.

The engine starts a plugin as `pulumi-resource-command [flags] <engine address>` and reads the port from the
first line of stdout. Logs go to stderr (the engine relays it) at WARNING, and with
SPARK_VLLM_COMMAND_DOUBLE_LOG=<file> every call is logged there at DEBUG.
"""

import logging
import os
import signal
import sys
from concurrent import futures

import grpc
from pulumi.runtime.proto import provider_pb2_grpc

from .rpc import UnknownCalls
from .service import LABEL, CommandDouble

MAX_MESSAGE_BYTES = 400 * 1024 * 1024  # the engine's own limit for provider messages


def _setup_logging() -> logging.Logger:
    log = logging.getLogger("command-double")
    log.setLevel(logging.DEBUG)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(logging.WARNING)
    log.addHandler(stderr)
    path = os.environ.get("SPARK_VLLM_COMMAND_DOUBLE_LOG")
    if path:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
        log.addHandler(handler)
    return log


def main() -> None:
    # The engine passes flags of its own (--logtostderr, -v=N, --tracing ...) before its address.
    engine = next((arg for arg in reversed(sys.argv[1:]) if not arg.startswith("-")), None)
    log = _setup_logging()

    servicer = CommandDouble(engine)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((UnknownCalls(LABEL, log),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()

    def stop(signum, frame):
        servicer.procs.cancel()  # no ssh process outlives the plugin
        server.stop(grace=2)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
