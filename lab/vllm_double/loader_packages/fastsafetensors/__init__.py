"""Stand-in for the `fastsafetensors` package in the lab's images: the vLLM double imports it for
`--load-format fastsafetensors`, as vLLM does, and spark-vllm's preflight checks that it imports. It loads nothing."""

__version__ = "0.0.0+lab"
