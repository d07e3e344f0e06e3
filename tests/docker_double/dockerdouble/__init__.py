"""pulumi-docker 5.2.0 test double: a Pulumi resource provider plugin for the tests of spark-vllm."""
