"""`python -m vllm` runs the same entry point as the `vllm` console script."""

from vllm.cli import main

main()
