"""vLLM's model_executor package, as far as the double has one: the loader registry."""
