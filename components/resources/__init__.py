"""The Pulumi components: each one a concept of a deployment (a node's Docker provider, the Ray containers, mp's
ranks, the serve, the gates, the fabric guard, the weights sync, the watchdog), their children and options."""
