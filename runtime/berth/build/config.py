"""The image configuration a build carries from step to step, and the
record (imageconfig.py's etc/berth/image.json) it becomes: the contract's
keys, and what berth start does not act on but a build records as BuildKit
does: labels, exposed ports, volumes, the stop signal, a SHELL (which a
build FROM the image then runs its shell forms with), the health check (as
Docker's image config has it: Test, Interval, Timeout, StartPeriod,
StartInterval in nanoseconds, Retries) and the ONBUILD triggers (each the
text after ONBUILD, run when a build names the image in a FROM)."""

import json
import typing

from berth.errors import BerthError
from berth.image import imageconfig

DEFAULT_SHELL = ("/bin/sh", "-c")


class ImageConfig(typing.NamedTuple):
    env: dict = {}
    workdir: str = ""
    user: str = ""
    shell: tuple = DEFAULT_SHELL
    cmd: list = None
    entrypoint: list = None
    labels: dict = {}
    expose: tuple = ()
    volumes: tuple = ()
    stopsignal: str = ""
    healthcheck: dict = None
    onbuild: tuple = ()


def from_record(text, where):
    """The ImageConfig of a base image's image.json text (None: an image without one)."""
    if text is None:
        return ImageConfig()
    try:
        record = json.loads(text)
        env = dict(entry.partition("=")[::2] for entry in record["env"])
        return ImageConfig(env=env, workdir=record["workdir"], user=record["user"],
                           cmd=record["cmd"], entrypoint=record["entrypoint"],
                           labels=dict(record.get("labels") or {}),
                           expose=tuple(record.get("expose") or ()),
                           volumes=tuple(record.get("volumes") or ()),
                           stopsignal=record.get("stopsignal") or "",
                           shell=tuple(record.get("shell") or DEFAULT_SHELL),
                           healthcheck=_healthcheck(record.get("healthcheck")),
                           onbuild=tuple(str(t) for t in record.get("onbuild") or ()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BerthError(f"{where}: the base image's {imageconfig.IMAGE_JSON} is not "
                         "Berth's image record") from None


def _healthcheck(found):
    if found is None:
        return None
    if not isinstance(found, dict) or not isinstance(found.get("Test"), list):
        raise TypeError("healthcheck")
    return dict(found)


def record(config, source):
    """The image.json record of `config`."""
    return {"env": [f"{k}={v}" for k, v in config.env.items()], "entrypoint": config.entrypoint,
            "cmd": config.cmd, "workdir": config.workdir, "user": config.user, "source": source,
            "digest": "", "labels": config.labels, "expose": list(config.expose),
            "volumes": list(config.volumes), "stopsignal": config.stopsignal,
            "shell": list(config.shell) if config.shell != DEFAULT_SHELL else None,
            "healthcheck": config.healthcheck, "onbuild": list(config.onbuild)}
