"""Test double of vLLM for spark-vllm's lab (NOT the real vLLM).

It stands in for the GPU process that spark-vllm starts on the head node with
`vllm serve MODEL --distributed-executor-backend ray ...`, so the deployment can be
tested end to end on machines without a GPU.

Emulated faithfully (messages follow real vLLM's wording):
  * `vllm serve` flag parsing: the flags spark-vllm uses and a few more; anything else
    is rejected by argparse (exit 2). Underscored spellings (--max_model_len) work as in vLLM.
  * Ray: `ray.init(address="auto")`, the VLLM_HOST_IP / driver-node checks, a placement
    group of TP*PP {"GPU": 1} bundles with the first bundle pinned to the driver node,
    one num_cpus=0/num_gpus=1 actor per bundle, a bounded placement-group wait.
  * Loading: config.json and architecture checks, every *.safetensors shard read in
    full (on the driver and on every Ray worker's node), tqdm-style progress lines,
    "Loading weights took ... seconds".
  * Serving: /health, /version, /v1/models, /v1/chat/completions (OpenAI shapes), the
    API key (--api-key or VLLM_API_KEY) on /v1/*, uvicorn-style start-up lines.
  * Exits non-zero with a logged exception on every failure, and when its Ray workers die.

Not emulated: GPUs, CUDA, NCCL, memory profiling, tokenizers and real inference; chat
answers are a deterministic function of the request. See lab/vllm_double/README.md.
"""

from vllm.registry import ModelRegistry

__version__ = "0.0.0+double"

__all__ = ["ModelRegistry", "__version__"]
