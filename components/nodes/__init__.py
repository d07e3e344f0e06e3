"""The nodes as this machine sees them: the one way over SSH (node_runner), what preflight's probe found
(node_facts), the weights they hold, their load floor, and a catalog entry written from them (discovery).

Nothing here registers a resource.
"""
