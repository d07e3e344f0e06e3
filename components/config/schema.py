"""A small reader for nested config mappings that reports errors by file and key path.

Every read goes through a `Section`, which knows where its data came from. That is how
each `ConfigError` can name the file, the key path, the bad value and what is accepted.
"""

from __future__ import annotations

import builtins
import difflib
import ipaddress
import posixpath
import re
from typing import Any, Callable, Iterable, Optional

import pulumi

from . import formats


class ConfigError(pulumi.RunError):
    """A configuration mistake, reported as one plain sentence (RunError: no traceback)."""

    def __init__(self, file: str, path: str, value: Any, accepted: str, problem: str = ""):
        self.file, self.path, self.value, self.accepted = file, path, value, accepted
        shown = "missing" if value is _MISSING else repr(value)
        what = problem or f"is {shown}"
        message = f"{file}: {path} {what}; expected {accepted}."
        # One line, whatever a key or value holds: escape line breaks rather than print them.
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


class _Shown:
    """Printed in place of a value."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


_MISSING: Any = _Shown("missing")
HIDDEN: Any = _Shown("<secret, not shown>")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
# `pulumi config set --path` stores what it is given as a string ('0.8', 'true'), and YAML 1.1 (the catalogs) reads
# yes/no/on/off as booleans: numbers and booleans are accepted in all these spellings, in every file alike.
_INT = re.compile(r"[-+]?[0-9]+")
_NUMBER = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")
_BOOLS = {spelling: flag for flag, words in ((True, ("yes", "on", "true")), (False, ("no", "off", "false")))
          for word in words for spelling in (word, word.capitalize(), word.upper())}


def closest(key: Any, known: Iterable[Any]) -> Optional[str]:
    """The known key that `key` most likely misspells (a wrong case, a typo), or None."""
    known = sorted(k for k in known if isinstance(k, str))
    if not isinstance(key, str):
        return None
    close = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return close[0] if close else None


def did_you_mean(key: Any, known: Iterable[Any]) -> str:
    near = closest(key, known)
    return f" (did you mean {near}?)" if near else ""


class Section:
    """One mapping of config, with the file it came from and its key path.

    Call the typed getters for every key you accept, then `done()`, which rejects any key
    that was not read: a typo in a key name is an error, not a silently ignored setting.
    Values of `secret_keys`, and every value of a `secret` section, are never printed.
    """

    def __init__(self, data: Any, file: str, path: str, sep: str = ".", secret: bool = False):
        if not isinstance(data, dict):
            raise ConfigError(file, path or "(top level)", HIDDEN if secret else data, "a mapping of keys to values")
        self.data, self.file, self.path, self.sep, self.secret = data, file, path, sep, secret
        self.secret_keys: set[str] = set()
        self._read: set[str] = set()

    def key_path(self, key: str) -> str:
        return f"{self.path}{self.sep}{key}" if self.path else key

    def shown(self, key: Any, value: Any) -> Any:
        hidden = self.secret or str(key) in self.secret_keys or str(key).split(".")[0] in self.secret_keys
        return HIDDEN if hidden else value

    def error(self, key: Any, value: Any, accepted: str, problem: str = "") -> ConfigError:
        return ConfigError(self.file, self.key_path(str(key)), self.shown(key, value), accepted, problem)

    def has(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, default: Any, accepted: str) -> Any:
        self._read.add(key)
        value = self.data.get(key, _MISSING)
        if value is None:
            value = _MISSING
        if value is _MISSING and default is _MISSING:
            # A key nothing has read that looks like this one (`fabricIP`) is why it is missing: name that one.
            typo = closest(key, set(self.data) - self._read)
            if typo is not None:
                raise self.error(typo, self.data[typo], f"{key}, which is required here",
                                 f"({self.shown(typo, self.data[typo])!r}) is not a known key (did you mean {key}?)")
            raise self.error(key, value, accepted, "is missing")
        return value

    def _typed(self, key, default, accepted, check: Callable[[Any], bool], parse: Callable[[Any], Any] = lambda v: v):
        value = self._get(key, default, accepted)
        if value is _MISSING:
            return default
        value = parse(value)
        if not check(value):
            raise self.error(key, value, accepted)
        return value

    def str(self, key: str, default: Any = _MISSING, pattern: Optional[re.Pattern] = None,
            accepted: str = "a non-empty string") -> Any:
        def fits(v: Any) -> builtins.bool:
            return isinstance(v, str) and v.strip() != "" and (pattern is None or pattern.match(v) is not None)

        value = self._typed(key, default, accepted, fits)
        bad = formats.control_character(value) if isinstance(value, str) else None
        if bad:
            # A value reaches a command line, a file or a header on the node; none of them takes a line break.
            raise self.error(key, value, f"{accepted}, on one line",
                             f"is {self.shown(key, value)!r}, which holds a control character ({bad})")
        return value

    def choice(self, key: builtins.str, options: tuple, default: Any = _MISSING) -> Any:
        def as_written(v: Any) -> Any:
            # YAML 1.1 reads `no` as false: a boolean is taken as the option it was written as.
            words = ("yes", "on", "true") if v is True else ("no", "off", "false") if v is False else ()
            return next((w for w in words if w in options), v)

        return self._typed(key, default, "one of " + ", ".join(map(repr, options)), lambda v: v in options, as_written)

    def bool(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "true or false", lambda v: isinstance(v, bool),
                           lambda v: _BOOLS.get(v, v) if isinstance(v, str) else v)

    def int(self, key: builtins.str, default: Any = _MISSING, lo: int = 1, hi: int = 2**31) -> Any:
        return self._typed(key, default, f"a whole number from {lo} to {hi}",
                           lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
                           lambda v: int(v) if isinstance(v, str) and _INT.fullmatch(v) else v)

    def fraction(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._typed(key, default, "a number in (0, 1]",
                            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                            lambda v: float(v) if isinstance(v, str) and _NUMBER.fullmatch(v) else v)
        return None if value is None else float(value)

    def port(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self.int(key, default, lo=1, hi=65535)

    def ipv4(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "an IPv4 address such as 192.168.200.1", is_ipv4)

    def host(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "an IPv4 address or a host name",
                           lambda v: isinstance(v, str) and (is_ipv4(v) or _is_host_name(v)))

    def name(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self.str(key, default, pattern=_NAME,
                        accepted="a name of lower-case letters, digits and dashes (at most 32)")

    def load_format(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "a vLLM load format such as auto, fastsafetensors or instanttensor "
                                         "(lower-case letters, digits and _; preflight checks that the image has it)",
                           lambda v: formats.fullmatch(formats.LOAD_FORMAT, v))

    def user(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "a user name of letters, digits, '.', '_' and '-', starting with a letter "
                                         "or '_', at most 32 characters",
                           lambda v: formats.fullmatch(formats.USER_NAME, v))

    def interface(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "a network interface name such as enp1s0f1np1 (at most 15 characters, "
                                         "no spaces, '/' or ':')",
                           lambda v: formats.fullmatch(formats.INTERFACE, v))

    def image(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "a Docker image reference such as nvcr.io/nvidia/vllm:26.03-py3 (a lower-case "
                                         "repository, no spaces)",
                           lambda v: formats.fullmatch(formats.IMAGE, v))

    def gpus(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, "'all', 'none', a GPU count such as 2, device=0, or several devices in "
                                         "double quotes such as '\"device=0,1\"'",
                           lambda v: formats.fullmatch(formats.GPUS, v), lambda v: str(v) if type(v) is int else v)

    def abs_path(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._get(key, default, "an absolute path")
        if value is _MISSING:
            return default
        if not formats.normal_absolute_path(value):
            plain = posixpath.normpath(value.strip()) if isinstance(value, str) else None
            raise self.error(key, value, "an absolute path on the node, written plainly (no ~, .., // or trailing /, "
                                         "no surrounding spaces)"
                             + (f": {plain!r}" if formats.normal_absolute_path(plain) else ""))
        return value

    def str_list(self, key: builtins.str, default: Any = _MISSING) -> Any:
        # `pulumi config set --path 'k[1]' 8192` stores a number: whole numbers are taken as written.
        value = self._typed(key, default, "a list of strings (whole numbers may stay unquoted)",
                            lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                            lambda v: [str(x) if type(x) is int else x for x in v] if isinstance(v, list) else v)
        return tuple(value) if isinstance(value, list) else value

    def env(self, key: builtins.str, default: Any = _MISSING) -> Any:
        """Environment variables: POSIX names, string values. Numbers and booleans must be quoted, as YAML turns `0`
        into a number, `no` into false and `1.10` into 1.1."""
        value = self._typed(key, default, "a mapping of names to string values", lambda v: isinstance(v, dict))
        for name, item in (value or {}).items():
            if not formats.fullmatch(formats.ENV_NAME, name):
                raise self.error(f"{key}.{name}", name, "a variable name of letters, digits and _, not starting with "
                                                       "a digit", f"has the name {name!r}")
            if not isinstance(item, str):
                raise self.error(f"{key}.{name}", item, 'a string (quote numbers and booleans: "0")')
            if "\0" in item:
                raise self.error(f"{key}.{name}", item, "a string without NUL characters")
        return dict(value) if isinstance(value, dict) else value

    def section(self, key: builtins.str, required: builtins.bool = False) -> "Section":
        value = self._get(key, _MISSING if required else {}, "a mapping of keys to values")
        return Section({} if value is _MISSING else value, self.file, self.key_path(key),
                       secret=self.secret or key in self.secret_keys)

    def sections(self, key: builtins.str) -> list["Section"]:
        value = self._typed(key, _MISSING, "a non-empty list of mappings",
                            lambda v: isinstance(v, list) and len(v) > 0)
        return [Section(item, self.file, f"{self.key_path(key)}[{i}]", secret=self.secret)
                for i, item in enumerate(value)]

    def unknown(self) -> list[Any]:
        return sorted(set(self.data) - self._read, key=str)

    def done(self) -> None:
        unknown = self.unknown()
        if unknown:
            key = unknown[0]
            raise self.error(key, self.data[key], "one of the known keys: " + ", ".join(sorted(self._read)),
                             f"({self.shown(key, self.data[key])!r}) is not a known key"
                             + did_you_mean(key, self._read))


def is_ipv4(value: Any) -> bool:
    try:
        ipaddress.IPv4Address(value)
        return isinstance(value, str)
    except ValueError:
        return False


def _is_host_name(value: str) -> bool:
    # A dotted number (`192.168.1`) matches the host-name pattern, but is a mistyped address.
    return _HOSTNAME.match(value) is not None and not all(part.isdigit() for part in value.split("."))
