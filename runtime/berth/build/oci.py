"""A built image as OCI: its history (an Entry per instruction of the
stages that led to the target), each changing step's layer (layers.py),
the image configuration (config, rootfs.diff_ids, history) and the
manifest that names them. The base image, flattened into one squashfs by
the import, becomes one layer of its whole tree, kept in the cache as a
step's is."""

import hashlib
import json
import os
import tempfile
import typing

from berth.build import layers, tree
from berth.errors import BerthError
from berth.image import imageconfig

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"


class Entry(typing.NamedTuple):
    created_by: str
    key: str = None      # the step key whose change the layer is (None: config only)
    image: str = None    # the squashfs of a whole layer's tree
    whole: bool = False  # the base image: its layer is its whole tree


class Blob(typing.NamedTuple):
    digest: str
    size: int
    path: str = None     # a file holding it (a layer), or
    data: bytes = None   # its bytes (the config, the manifest)


class Image(typing.NamedTuple):
    manifest: Blob
    blobs: list          # every Blob the manifest names, the config first


def begun(stage, state, histories):
    """The history of `stage` before its first step (state: base.begin's)."""
    if stage.base_stage is not None:
        return list(histories[stage.base_stage])
    if state.image is None:
        return []
    return [Entry(f"FROM {stage.base}", key=state.image_key, image=state.image, whole=True)]


def after(step, before, state):
    """The Entry of `step`, which took the State `before` to `state`."""
    if state.layers == before.layers:
        return Entry(step.original)
    return Entry(step.original, key=state.layers[-1])


def _whole_layer(cfg, image):
    try:  # (a private directory of its own, whoever else uses ENROOT_TEMP_PATH)
        work = tempfile.mkdtemp(prefix="berth-build.", dir=cfg["ENROOT_TEMP_PATH"])
    except OSError as e:
        raise BerthError(f"ENROOT_TEMP_PATH {cfg['ENROOT_TEMP_PATH']}: {e.strerror}") from None
    try:
        root = os.path.join(work, "base")
        tree.unpack(image, root)
        return layers.write(cfg, root, layers.changes(layers.Snapshot({}),
                                                      layers.snapshot(root)))
    finally:
        tree.remove(work)


def _layer(cfg, entry):
    found = layers.kept(cfg, entry.key)
    if found is None and entry.whole:
        found = _whole_layer(cfg, entry.image)
        layers.keep(cfg, entry.key, found)
    if found is None:
        raise BerthError(f"{entry.created_by}: the step's layer is gone from the image cache; "
                         "build again with --no-cache")
    return layers.compressed(cfg, entry.key, found)


def _config(config):
    """The OCI `config` object of the build's ImageConfig."""
    fields = {"Env": [f"{k}={v}" for k, v in config.env.items()],
              "Entrypoint": config.entrypoint, "Cmd": config.cmd,
              "WorkingDir": config.workdir, "User": config.user, "Labels": config.labels,
              "ExposedPorts": {port: {} for port in config.expose},
              "Volumes": {volume: {} for volume in config.volumes},
              "StopSignal": config.stopsignal}
    return {name: value for name, value in fields.items() if value}


def _blob(document):
    data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return Blob(digest=f"sha256:{hashlib.sha256(data).hexdigest()}", size=len(data), data=data)


def descriptor(blob, media_type):
    return {"mediaType": media_type, "digest": blob.digest, "size": blob.size}


def image(cfg, *, history, config):
    """The Image of `history` (Entries) with `config` (an ImageConfig)."""
    found = [(entry, _layer(cfg, entry)) for entry in history if entry.key]
    history_field = [{"created_by": entry.created_by, **({} if entry.key else
                                                          {"empty_layer": True})}
                     for entry in history]
    config_blob = _blob({"architecture": imageconfig.goarch(), "os": "linux",
                         "config": _config(config), "history": history_field,
                         "rootfs": {"type": "layers",
                                    "diff_ids": [layer.diff_id for _, layer in found]}})
    layer_blobs = [Blob(digest=layer.digest, size=layer.packed_size,
                        path=layers.packed_path(cfg, layer)) for _, layer in found]
    manifest = _blob({"schemaVersion": 2, "mediaType": MANIFEST,
                      "config": descriptor(config_blob, CONFIG),
                      "layers": [descriptor(blob, LAYER) for blob in layer_blobs]})
    return Image(manifest=manifest, blobs=[config_blob, *layer_blobs])
