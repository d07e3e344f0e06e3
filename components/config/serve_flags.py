"""The `vllm serve` flags that `extraArgs` may not hold: those spark-vllm sets from its own keys, and those that
would put a secret on a command line.

vLLM keeps the last of a repeated flag, so an extra `--port 9000` moves the API away from where the readiness gate
polls, and `--tensor-parallel-size 4` gets around the TP x PP check. vLLM's parser reads `--max_model_len` as
`--max-model-len` (up to the first `.` of its dotted form), `--flag=value` as `--flag value`, and, as argparse does,
any unambiguous beginning of a flag (`--max-model`) as the whole flag: each of these counts as the flag.
"""

from __future__ import annotations

from typing import Optional

# Flag -> the key it comes from (None: spark-vllm always sets it). serve_argv emits exactly these.
OWNED: dict[str, Optional[str]] = {
    "--model": "serve.path",  # vLLM takes --model over the positional model
    "--served-model-name": "serve.servedName",
    "--host": "api.bind of the cluster",
    "--port": "api.port of the cluster",
    "--tensor-parallel-size": "serve.tensorParallel",
    "--pipeline-parallel-size": "serve.pipelineParallel",
    "--distributed-executor-backend": "serve.executor",
    "--gpu-memory-utilization": "serve.gpuMemoryUtilization",
    "--load-format": "serve.loadFormat",
    "--max-model-len": "serve.maxModelLen",
    "--max-num-seqs": "serve.maxNumSeqs",
    "--enforce-eager": "serve.enforceEager",
    "--no-enforce-eager": "serve.enforceEager",
    # executor mp: mp_rank.rank_command adds these to each rank's serve_argv.
    "--nnodes": None,
    "--node-rank": None,
    "--master-addr": "the head's fabricIp",
    "--master-port": "mp.masterPort of the cluster",
    "--headless": None,
}
SHORT = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}  # vLLM's own aliases
# Flag -> the secret config key that carries the same value without a command line.
SECRET = {"--api-key": "apiKey", "--hf-token": "hfToken"}


def flag(arg: str) -> Optional[str]:
    """The owned or secret flag that the extraArgs element `arg` sets, as vLLM reads it, or None."""
    name = arg.split("=", 1)[0]
    if name.startswith("--") and len(name) > 2:
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
        return _beginning_of(name, (*OWNED, *SECRET))
    if name.startswith("-") and len(name) > 1:
        short = _beginning_of(name, SHORT)
        return SHORT[short] if short else None
    return None


def _beginning_of(name: str, flags) -> Optional[str]:
    matches = sorted(f for f in flags if f.startswith(name))
    return name if name in matches else (matches[0] if matches else None)


def shown(arg: str) -> str:
    """`arg` as an error may print it: without the value of `--flag=value`, which may be a secret."""
    return arg.split("=", 1)[0] + "=..." if "=" in arg else arg
