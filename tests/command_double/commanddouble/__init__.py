"""pulumi-command 1.2.1 test double: a Pulumi resource provider plugin for the tests of spark-vllm."""
