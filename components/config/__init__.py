"""The stack's config: read from Pulumi and the catalogs, checked once, into the `spec` types everything else reads.

Nothing here reaches a node or registers a resource.
"""
