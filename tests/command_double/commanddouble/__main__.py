"""Entry point of the plugin (providerkit.plugin serves it). Warnings go to stderr (the engine relays it); with
SPARK_VLLM_COMMAND_DOUBLE_LOG=<file> every call, and every line sent to the engine, is logged there at DEBUG."""

import sys

import providerkit.lean_protos  # noqa: F401  (first: the protos without the SDK's start-up)
from providerkit import plugin

from .service import CommandDouble


def main() -> None:
    engine = plugin.engine_address(sys.argv)
    plugin.setup_logging("command-double", "SPARK_VLLM_COMMAND_DOUBLE_LOG")
    servicer = CommandDouble(engine)
    plugin.serve(servicer, on_signal=servicer.procs.cancel)  # no ssh process outlives the plugin


if __name__ == "__main__":
    main()
