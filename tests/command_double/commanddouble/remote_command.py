"""`command:remote:Command` of pulumi-command 1.2.1 (an `infer` resource of pulumi-go-provider).

Facts from upstream this follows:
- Check fills schema defaults (`addPreviousOutputInEnv` true, connection defaults in connection.py).
- Diff is infer's structural diff of old inputs against new ones (objdiff.py): changes are in-place updates, except
  that `triggers` (marked replaceOnChanges in the schema) being added or removed as a whole is a replacement.
  Element changes come back as `triggers[i]` updates, which the engine makes replacements because the SDK
  registers every Command with `replaceOnChanges: ["triggers[*]"]`. deleteBeforeReplace is left to the program.
- Create: id = resource name + 8 random hex digits; runs `create` (if set) with `stdin`; Update runs `update`,
  else `create`; Delete runs `delete` (if set), with the stored `stdin` too. stdout/stderr are captured with one
  trailing newline trimmed; a failure is `<exit error>: running "<cmd>":\n<stdout+stderr>`.
- Output lines go to the engine as ephemeral INFO messages (stdout and stderr alike), filtered by `logging`.
- Outputs are the inputs plus stdout/stderr. Secretness flows only to outputs of the same name (so stdout is not
  secret because stdin is), and `connection` is always secret. In preview stdout/stderr are unknown.
- There is no Read: the state is returned unchanged on refresh.

Refused with a Check failure: `environment` when non-empty (pulumi-command sends it with SSH setenv; the double
has no way to do that without exposing values, and sshd drops such variables unless AcceptEnv lists them).
For the same reason PULUMI_COMMAND_STDOUT/STDERR (addPreviousOutputInEnv) are never sent: a warning says so
when upstream would have tried, which is what upstream reports against an sshd without AcceptEnv.
"""

import secrets

from providerkit import engine_log, values
from providerkit.rpc import CheckFailures

from . import connection, objdiff, ssh_session
from .goquote import go_quote

TOKEN = "command:remote:Command"
LABEL = "Command"
INPUTS = ("connection", "create", "update", "delete", "stdin", "environment", "triggers", "logging",
          "addPreviousOutputInEnv")
STRINGS = ("create", "update", "delete", "stdin")
REPLACE_ON_CHANGES = frozenset({"triggers"})  # provider:"replaceOnChanges" in upstream's schema
LOGGING = ("stdout", "stderr", "stdoutAndStderr", "none")
PREVIOUS_OUTPUT_ENV = {"stdout": "PULUMI_COMMAND_STDOUT", "stderr": "PULUMI_COMMAND_STDERR"}


class CommandFailed(RuntimeError):
    """The remote command exited with a non-zero status."""


def check(news: dict) -> tuple[dict, CheckFailures]:
    failures = CheckFailures()
    checked = dict(news)
    for key, value in news.items():
        if key not in INPUTS:
            failures.add(key, f"the command test double does not implement {LABEL} property '{key}'")
        elif values.contains_unknown(value) or value is None:
            continue
        elif key in STRINGS and not isinstance(values.plain(value), str):
            failures.add(key, f"{key} must be a string")
        elif key == "environment" and values.plain(value):
            failures.add(key, f"the command test double does not implement {LABEL} property 'environment' "
                              "(pulumi-command passes it with SSH setenv; leave it empty)")
        elif key == "triggers" and not isinstance(values.plain(value), list):
            failures.add(key, "triggers must be a list")
        elif key == "logging" and values.plain(value) not in LOGGING:
            failures.add(key, f"logging must be one of {', '.join(LOGGING)}")
        elif key == "addPreviousOutputInEnv" and not isinstance(values.plain(value), bool):
            failures.add(key, "addPreviousOutputInEnv must be a boolean")
    if news.get("connection") is None:
        failures.add("connection", "Missing required property 'connection'")
    else:
        checked["connection"] = connection.check(news["connection"], failures)
    if checked.get("addPreviousOutputInEnv") is None:
        checked["addPreviousOutputInEnv"] = True
    return checked, failures


def diff(olds: dict, news: dict) -> tuple[dict[str, int], bool]:
    """(detailedDiff, has changes) between the stored state and the new checked inputs."""
    detailed = objdiff.detailed_diff({k: olds.get(k) for k in INPUTS}, {k: news.get(k) for k in INPUTS})
    for path, kind in detailed.items():
        if path in REPLACE_ON_CHANGES:
            detailed[path] = objdiff.AS_REPLACE[kind]
    return detailed, bool(detailed)


def _outputs(inputs: dict, stdout, stderr) -> dict:
    outputs = {k: v for k, v in inputs.items() if k in INPUTS and v is not None}
    if "connection" in outputs and not values.is_secret(outputs["connection"]):
        outputs["connection"] = values.secret(outputs["connection"])
    outputs["stdout"], outputs["stderr"] = stdout, stderr
    return outputs


class Runner:
    """Runs a Command's commands for one request: ssh processes, engine messages about the resource `urn`."""

    def __init__(self, procs: ssh_session.Processes, engine: engine_log.EngineLog, urn: str):
        self.procs, self.engine, self.urn = procs, engine, urn

    def run(self, spec: dict, command: str, previous: dict | None = None) -> tuple[str, str]:
        p = values.plain(spec)
        if previous and p.get("addPreviousOutputInEnv", True):
            self._warn_previous_output(previous)
        mode = p.get("logging") or "stdoutAndStderr"
        shown = {"stdout": mode in ("stdout", "stdoutAndStderr"), "stderr": mode in ("stderr", "stdoutAndStderr")}

        def on_line(stream: str, line: str) -> None:
            if shown[stream]:
                self.engine.send(self.urn, line)

        target, proxy = connection.endpoints(spec["connection"])
        result = ssh_session.run(self.procs, target, proxy, command, (p.get("stdin") or "").encode(), on_line,
                                 lambda message: self.engine.send(self.urn, message))
        if result.exit_status != 0:
            raise CommandFailed(f"Process exited with status {result.exit_status}: running {go_quote(command)}:\n"
                                + result.combined.decode(errors="replace"))
        return (result.stdout.decode(errors="replace").removesuffix("\n"),
                result.stderr.decode(errors="replace").removesuffix("\n"))

    def _warn_previous_output(self, previous: dict) -> None:
        for key, variable in PREVIOUS_OUTPUT_ENV.items():
            if values.plain(previous.get(key)):
                self.engine.send(self.urn, f"Unable to set '{variable}': the command test double does not send "
                                           "it (pulumi-command uses SSH setenv, which sshd refuses unless AcceptEnv "
                                           "lists it); set addPreviousOutputInEnv to false to silence this",
                                 severity=engine_log.WARNING, ephemeral=False)

    def create(self, name: str, news: dict, preview: bool) -> tuple[str, dict]:
        rid = name + secrets.token_hex(4)
        if preview:
            return rid, _outputs(news, values.UNKNOWN, values.UNKNOWN)
        command = values.plain(news.get("create"))
        stdout, stderr = self.run(news, command) if command is not None else ("", "")
        return rid, _outputs(news, stdout, stderr)

    def update(self, olds: dict, news: dict, preview: bool) -> dict:
        if preview:
            return _outputs(news, values.UNKNOWN, values.UNKNOWN)
        stdout, stderr = olds.get("stdout", ""), olds.get("stderr", "")
        command = values.plain(news.get("update") if news.get("update") is not None else news.get("create"))
        if command is not None:
            stdout, stderr = self.run(news, command, previous=olds)
        return _outputs(news, stdout, stderr)

    def delete(self, state: dict) -> None:
        command = values.plain(state.get("delete"))
        if command is not None:
            self.run(state, command, previous=state)
