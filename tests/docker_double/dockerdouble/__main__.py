"""Entry point of the plugin (providerkit.plugin serves it). Warnings go to stderr and to the engine; with
SPARK_VLLM_DOCKER_DOUBLE_LOG=<file> every call is logged there at DEBUG."""

import sys

import providerkit.lean_protos  # noqa: F401  (first: the protos without the SDK's start-up)
from providerkit import plugin

from .service import DockerDouble


def main() -> None:
    engine = plugin.engine_address(sys.argv)
    plugin.setup_logging("docker-double", "SPARK_VLLM_DOCKER_DOUBLE_LOG")
    servicer = DockerDouble(engine)
    plugin.serve(servicer)
    if servicer.client is not None:
        servicer.client.close()


if __name__ == "__main__":
    main()
