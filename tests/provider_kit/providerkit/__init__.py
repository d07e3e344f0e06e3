"""What the Pulumi provider test doubles of spark-vllm share: plugin process, gRPC plumbing, Struct values."""
