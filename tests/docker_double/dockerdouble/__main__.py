"""Entry point: serve the provider on a free localhost port and print that port, as Pulumi plugins must.

The engine starts a plugin as `pulumi-resource-docker [flags] <engine address>` and reads the port from the
first line of stdout. Warnings go to stderr (which the engine keeps for its verbose logs), and with
SPARK_VLLM_DOCKER_DOUBLE_LOG=<file> every call is logged there at DEBUG. Warnings also go to the engine.
"""

import logging
import os
import signal
import sys
from concurrent import futures

import grpc
from pulumi.runtime.proto import provider_pb2_grpc

from .engine_log import EngineLog
from .service import DockerDouble, UnknownCalls

MAX_MESSAGE_BYTES = 400 * 1024 * 1024  # the engine's own limit for provider messages


def _setup_logging() -> None:
    log = logging.getLogger("docker-double")
    log.setLevel(logging.DEBUG)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(logging.WARNING)
    log.addHandler(stderr)
    path = os.environ.get("SPARK_VLLM_DOCKER_DOUBLE_LOG")
    if path:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
        log.addHandler(handler)


def main() -> None:
    # The engine passes flags of its own (--logtostderr, -v=N, --tracing ...) before its address.
    engine = next((arg for arg in reversed(sys.argv[1:]) if not arg.startswith("-")), None)
    _setup_logging()

    engine_log = EngineLog(engine)
    servicer = DockerDouble(engine_log)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((UnknownCalls(engine_log),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()

    def stop(signum, frame):
        server.stop(grace=2)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()
    if servicer.client is not None:
        servicer.client.close()


if __name__ == "__main__":
    main()
