"""Emulated DGX Spark lab for spark-vllm (stdlib only; driven by lab/lab)."""
