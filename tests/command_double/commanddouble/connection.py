"""The `connection` input of command:remote:Command (and its `proxy`): validation, schema defaults, endpoints.

pulumi-command 1.2.1 declares `connection` secret and fills defaults in Check: user `root`, port 22,
dialErrorLimit 10, perDialTimeout 15 (the same for `proxy`). The SDK sends the whole connection as one secret;
the double keeps every wrapper where it found it, and wraps `privateKey` as a secret of its own, as upstream's
schema does (so the state it writes is the real plugin's).

Refused, with a Check failure naming the property: `password` (keyboard/password auth would need an askpass
helper around the ssh binary), `privateKeyPassword` (encrypted keys, same reason) and `hostKey` (host key
pinning). The program authenticates with unencrypted keys and does not pin host keys.
"""

from dataclasses import dataclass

from providerkit import values
from providerkit.rpc import CheckFailures

DEFAULTS = {"user": "root", "port": 22, "dialErrorLimit": 10, "perDialTimeout": 15}
FIELDS = frozenset({"host", "port", "user", "privateKey", "agentSocketPath", "dialErrorLimit", "perDialTimeout"})
REFUSED = {
    "password": "password authentication (the double drives the ssh binary non-interactively; use privateKey)",
    "privateKeyPassword": "encrypted private keys (the double drives the ssh binary non-interactively)",
    "hostKey": "host key pinning (the double ignores host keys, as pulumi-command does without hostKey)",
}


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    private_key: str | None
    agent_socket: str | None
    dial_error_limit: int
    per_dial_timeout: int


def check(value, failures: CheckFailures, path: str = "connection"):
    """`value` with defaults filled in (wrappers kept); problems are added to `failures`."""
    secret = values.is_secret(value)
    inner = value.get("value") if secret else value
    if values.contains_unknown(inner) and not isinstance(inner, dict):
        return value  # known only at `up`; checked again then
    if not isinstance(inner, dict):
        failures.add(path, f"{path} must be an object")
        return value
    allowed = FIELDS | ({"proxy"} if path == "connection" else set())
    checked = dict(inner)
    for key, sub in inner.items():
        name = f"{path}.{key}"
        if key in REFUSED:
            failures.add(name, f"the command test double does not implement Command property '{name}': "
                               f"{REFUSED[key]}")
        elif key not in allowed:
            failures.add(name, f"the command test double does not implement Command property '{name}'")
        elif key == "proxy" and sub is not None:
            checked[key] = check(sub, failures, name)
        elif not values.contains_unknown(sub):
            _check_field(key, values.plain(sub), name, failures)
    if inner.get("host") is None:
        failures.add(f"{path}.host", f"Missing required property '{path}.host'")
    for key, default in DEFAULTS.items():
        if checked.get(key) is None:
            checked[key] = default
    # Upstream's schema marks the key secret: its Check wraps it even inside a secret connection.
    if checked.get("privateKey") is not None and not values.is_secret(checked["privateKey"]):
        checked["privateKey"] = values.secret(checked["privateKey"])
    return values.secret(checked) if secret else checked


def _check_field(key: str, value, name: str, failures: CheckFailures) -> None:
    if value is None:
        return
    if key in ("host", "user", "privateKey", "agentSocketPath"):
        if not isinstance(value, str) or (key == "host" and not value):
            failures.add(name, f"{name} must be a non-empty string" if key == "host" else f"{name} must be a string")
    elif key == "port":
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
            failures.add(name, f"{name} must be a port number (1-65535)")
    elif not isinstance(value, int) or isinstance(value, bool) or value < (-1 if key == "dialErrorLimit" else 0):
        limit = "-1 (unlimited) or more" if key == "dialErrorLimit" else "0 (no limit) or more"
        failures.add(name, f"{name} must be an integer, {limit}")


def _endpoint(plain: dict) -> Endpoint:
    def get(key):
        return DEFAULTS[key] if plain.get(key) is None else plain[key]
    return Endpoint(host=plain["host"], port=int(get("port")), user=get("user"),
                    private_key=plain.get("privateKey"), agent_socket=plain.get("agentSocketPath"),
                    dial_error_limit=int(get("dialErrorLimit")), per_dial_timeout=int(get("perDialTimeout")))


def endpoints(connection) -> tuple[Endpoint, Endpoint | None]:
    """(target, proxy or None) from a connection as stored (wrappers allowed, values known)."""
    plain = values.plain(connection)
    proxy = plain.get("proxy")
    return _endpoint(plain), (_endpoint(proxy) if proxy else None)
