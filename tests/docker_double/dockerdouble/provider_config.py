"""Configuration of the `pulumi:providers:docker` provider: `host` and `sshOpts`.

The pulumi_docker Python SDK sends `sshOpts` JSON-encoded as a string (its provider marks list inputs that
way); stack config may give it as a JSON string too. The engine adds keys of its own (`version`,
`pluginDownloadURL`), which are tolerated.
"""

import json

from providerkit import values
from providerkit.rpc import CheckFailures

from . import props

TOKEN = "pulumi:providers:docker"
DEFAULT_HOST = "unix:///var/run/docker.sock"
ENGINE_KEYS = frozenset({"version", "pluginDownloadURL"})
TABLE = {
    "host": props.Prop(force_new=False),
    "sshOpts": props.Prop(force_new=False),
}


def ssh_opts(value) -> list[str]:
    value = values.plain(value)
    if value in (None, ""):
        return []
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("sshOpts must be a list of strings")
    return value


def check(news: dict) -> tuple[dict, CheckFailures]:
    failures = CheckFailures()
    props.check_names("provider config", TABLE, {k: v for k, v in news.items() if k not in ENGINE_KEYS}, failures)
    host = news.get("host")
    if host is not None and not values.contains_unknown(host):
        if not values.plain(host).startswith(("ssh://", "unix://")):
            failures.add("host", f"host {values.plain(host)!r}: the docker test double supports only ssh:// "
                                 "and unix:// hosts")
    checked = dict(news)
    opts = news.get("sshOpts")
    if opts is not None and not values.contains_unknown(opts):
        try:
            # The bridge stores the list re-encoded as compact JSON; the state must read the same to both.
            checked["sshOpts"] = values.like(opts, json.dumps(ssh_opts(opts), separators=(",", ":")))
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            failures.add("sshOpts", str(err))
    return checked, failures


def diff(olds: dict, news: dict) -> dict[str, int]:
    """A changed host or sshOpts updates the provider in place (the bridge never replaces docker providers)."""
    def normalized(config: dict) -> dict:
        out = dict(config)
        if "sshOpts" in out and not values.contains_unknown(out["sshOpts"]):
            out["sshOpts"] = ssh_opts(out["sshOpts"])
        return out
    return props.diff(TABLE, normalized(olds), normalized(news))


def from_configure(args: dict) -> tuple[str, list[str]] | None:
    """(host, sshOpts) from Configure's args, or None when a value is still unknown (preview)."""
    if values.contains_unknown({k: args.get(k) for k in TABLE}):
        return None
    return values.plain(args.get("host")) or DEFAULT_HOST, ssh_opts(args.get("sshOpts"))
