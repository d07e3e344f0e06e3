"""Stand-in for the `instanttensor` package (vllm[instanttensor]) in the lab's Ray image only: the vLLM double imports
it for `--load-format instanttensor`, as vLLM does; the lab's mp image lacks it, so that preflight's refusal is
tested. It loads nothing."""

__version__ = "0.0.0+lab"
