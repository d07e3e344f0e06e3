"""A small reader for nested config mappings that reports errors by file and key path.

Every read goes through a `Section`, which knows where its data came from. That is how
each `ConfigError` can name the file, the key path, the bad value and what is accepted.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Callable, Optional

import pulumi


class ConfigError(pulumi.RunError):
    """A configuration mistake, reported as one plain sentence (RunError: no traceback)."""

    def __init__(self, file: str, path: str, value: Any, accepted: str, problem: str = ""):
        self.file, self.path, self.value, self.accepted = file, path, value, accepted
        shown = "missing" if value is _MISSING else repr(value)
        what = problem or f"is {shown}"
        message = f"{file}: {path} {what}; expected {accepted}."
        # One line, whatever a key or value holds: escape line breaks rather than print them.
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


class _Missing:
    def __repr__(self) -> str:
        return "missing"


_MISSING: Any = _Missing()
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")


class Section:
    """One mapping of config, with the file it came from and its key path.

    Call the typed getters for every key you accept, then `done()`, which rejects any key
    that was not read: a typo in a key name is an error, not a silently ignored setting.
    """

    def __init__(self, data: Any, file: str, path: str, sep: str = "."):
        if not isinstance(data, dict):
            raise ConfigError(file, path or "(top level)", data, "a mapping of keys to values")
        self.data, self.file, self.path, self.sep = data, file, path, sep
        self._read: set[str] = set()

    def key_path(self, key: str) -> str:
        return f"{self.path}{self.sep}{key}" if self.path else key

    def error(self, key: str, value: Any, accepted: str, problem: str = "") -> ConfigError:
        return ConfigError(self.file, self.key_path(key), value, accepted, problem)

    def has(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, default: Any, accepted: str) -> Any:
        self._read.add(key)
        value = self.data.get(key, _MISSING)
        if value is None:
            value = _MISSING
        if value is _MISSING and default is _MISSING:
            raise self.error(key, value, accepted, "is missing")
        return value

    def _typed(self, key, default, accepted, check: Callable[[Any], bool]):
        value = self._get(key, default, accepted)
        if value is _MISSING:
            return default
        if not check(value):
            raise self.error(key, value, accepted)
        return value

    def str(self, key: str, default: Any = _MISSING, pattern: Optional[re.Pattern] = None,
            accepted: str = "a non-empty string") -> Any:
        return self._typed(key, default, accepted,
                           lambda v: isinstance(v, str) and v.strip() != "" and (pattern is None or pattern.match(v)))

    def choice(self, key: str, options: tuple, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "one of " + ", ".join(map(repr, options)), lambda v: v in options)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "true or false", lambda v: isinstance(v, bool))

    def int(self, key: str, default: Any = _MISSING, lo: int = 1, hi: int = 2**31) -> Any:
        return self._typed(key, default, f"a whole number from {lo} to {hi}",
                           lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi)

    def fraction(self, key: str, default: Any = _MISSING) -> Any:
        value = self._typed(key, default, "a number in (0, 1]",
                            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1)
        return None if value is None else float(value)

    def port(self, key: str, default: Any = _MISSING) -> Any:
        return self.int(key, default, lo=1, hi=65535)

    def ipv4(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "an IPv4 address such as 192.168.200.1", _is_ipv4)

    def host(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "an IPv4 address or a host name",
                           lambda v: isinstance(v, str) and (_is_ipv4(v) or (_HOSTNAME.match(v) and not _looks_numeric(v))))

    def name(self, key: str, default: Any = _MISSING) -> Any:
        return self.str(key, default, pattern=_NAME,
                        accepted="a name of lower-case letters, digits and dashes (at most 32)")

    def str_list(self, key: str, default: Any = _MISSING) -> Any:
        value = self._typed(key, default, "a list of strings",
                            lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
        return tuple(value) if isinstance(value, list) else value

    def str_map(self, key: str, default: Any = _MISSING) -> Any:
        value = self._typed(key, default, "a mapping of names to string values", lambda v: isinstance(v, dict))
        for name, item in (value or {}).items():
            if not isinstance(item, str):
                raise self.error(f"{key}.{name}", item, 'a string (quote numbers and booleans: "0")')
        return dict(value) if isinstance(value, dict) else value

    def section(self, key: str, required: bool = False) -> "Section":
        value = self._get(key, _MISSING if required else {}, "a mapping of keys to values")
        return Section({} if value is _MISSING else value, self.file, self.key_path(key))

    def sections(self, key: str) -> list["Section"]:
        value = self._typed(key, _MISSING, "a non-empty list of mappings",
                            lambda v: isinstance(v, list) and len(v) > 0)
        return [Section(item, self.file, f"{self.key_path(key)}[{i}]") for i, item in enumerate(value)]

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._read, key=str)
        if unknown:
            key = unknown[0]
            raise self.error(str(key), self.data[key], "one of the known keys: " + ", ".join(sorted(self._read)),
                             f"({self.data[key]!r}) is not a known key")


def _is_ipv4(value: Any) -> bool:
    try:
        ipaddress.IPv4Address(value)
        return isinstance(value, str)
    except ValueError:
        return False


def _looks_numeric(value: str) -> bool:
    return all(part.isdigit() for part in value.split("."))
