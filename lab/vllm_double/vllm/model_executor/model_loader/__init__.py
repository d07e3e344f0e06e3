"""vLLM 0.33's loader registry (model_executor/model_loader/__init__.py): load format -> loader, which spark-vllm's
preflight reads from an image to know which `--load-format` its vLLM takes. The double keeps the names only."""

_LOAD_FORMAT_TO_MODEL_LOADER = {
    "auto": "DefaultModelLoader",
    "dummy": "DummyModelLoader",
    "fastsafetensors": "DefaultModelLoader",
    "hf": "DefaultModelLoader",
    "instanttensor": "DefaultModelLoader",
    "ipc_cache": "IPCCacheModelLoader",
    "mistral": "DefaultModelLoader",
    "modelexpress": "ModelExpressModelLoader",
    "npcache": "DefaultModelLoader",
    "pt": "DefaultModelLoader",
    "runai_streamer": "RunaiModelStreamerLoader",
    "runai_streamer_sharded": "ShardedStateLoader",
    "safetensors": "DefaultModelLoader",
    "sharded_state": "ShardedStateLoader",
    "tensorizer": "TensorizerLoader",
}
