"""`docker:index/remoteImage:RemoteImage` with inputs `name` and `keepLocally` only.

The image must already be on the node: where pulumi-docker would pull, the double fails naming the image and
the node, and says that pulumi-docker would pull it there. Outputs follow pulumi-docker: `imageId` (the image's sha256 id), `repoDigest` (first RepoDigest, or ""),
and the resource id is the image id followed by the name.
"""

import urllib.parse

from providerkit import values
from providerkit.rpc import CheckFailures

from . import props
from .dockerapi import DockerError, DockerHost

TOKEN = "docker:index/remoteImage:RemoteImage"
LABEL = "RemoteImage"
TABLE = {
    "name": props.Prop(),
    "keepLocally": props.Prop(force_new=False),
}


def check(news: dict) -> tuple[dict, CheckFailures]:
    failures = CheckFailures()
    props.check_names(LABEL, TABLE, news, failures)
    if "name" not in news:
        failures.add("name", "Missing required property 'name'")
    return dict(news), failures


def diff(olds: dict, news: dict) -> dict[str, int]:
    return props.diff(TABLE, olds, news)


def _outputs(inputs: dict, image: dict) -> dict:
    outputs = {k: v for k, v in inputs.items() if k in TABLE}
    outputs["imageId"] = image["Id"]
    outputs["repoDigest"] = (image.get("RepoDigests") or [""])[0]
    return outputs


def preview_outputs(news: dict) -> dict:
    return {**news, "imageId": values.UNKNOWN, "repoDigest": values.UNKNOWN}


def create(client: DockerHost, news: dict) -> tuple[str, dict]:
    name = values.plain(news["name"])
    image = client.inspect("images", name)
    if image is None:
        raise RuntimeError(f"Unable to read Docker image {name!r} into resource: it is not present on {client.host}; "
                           "pulumi-docker would pull it here, and the docker test double never pulls (load the "
                           "image onto the node first)")
    return image["Id"] + name, _outputs(news, image)


def read(client: DockerHost, state: dict, inputs: dict) -> tuple[str, dict, dict]:
    name = values.plain(state.get("name") or inputs.get("name"))
    image = client.inspect("images", name)
    if image is None:
        return "", {}, {}
    given = {k: v for k, v in (inputs or state).items() if k in TABLE}
    return image["Id"] + name, _outputs(state or inputs, image), given


def update(client: DockerHost, news: dict) -> dict:
    return create(client, news)[1]


def delete(client: DockerHost, state: dict) -> None:
    p = values.plain(state)
    if p.get("keepLocally"):
        return
    try:
        client.call("DELETE", "/images/" + urllib.parse.quote(p["name"], safe="/:@"))
    except DockerError as err:
        if err.status != 404:
            raise RuntimeError(f"Unable to remove Docker image: {err}") from err
