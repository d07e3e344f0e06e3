"""What a stack deploys, by its kind: a model, or the gateway in front of models."""
