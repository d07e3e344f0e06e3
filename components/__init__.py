"""spark-vllm's program, by role. Imports go one way: config <- nodes <- resources <- preflight <- __main__.py.

- config/: the stack's config, read and checked once, into the types everything else reads;
- nodes/: the nodes as this machine sees them: the way over SSH, the probe's facts, the weights, the load floor;
- resources/: the Pulumi components;
- preflight/: the checks before any resource, and day two's judgement of what still runs;
- remote/: what runs on a node, sent there over SSH;
- stack_cli.py and text.py: the stack as the CLI shows it to scripts/status and scripts/logs, and the plain text
  every part prints.
"""
