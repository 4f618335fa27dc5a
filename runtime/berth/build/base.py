"""FROM: the State a stage begins with. An earlier stage's end; `scratch`,
an empty root; a local image file (a path ending in .sqsh, Berth's own
form); or a registry image, taken through the image cache as `berth
import --cache-only docker://IMAGE` takes it (the shared store, the
cache's locks and registries.conf included)."""

import os

from berth.build import config as imagecfg, stepcache, tree
from berth.build.steps import State
from berth.errors import BerthError
from berth.image import imagefile, reference


def registry_uri(image):
    """The docker:// URI of a FROM line's image: Docker's rule, a first
    component with '.' or ':' or named localhost is the registry (written
    with enroot's '#'); an enroot URI or an EDF's REGISTRY#IMAGE stays."""
    if image.startswith(reference.SCHEMES):
        return image
    return f"{reference.SCHEME}{reference.in_enroot_form(image)}"


def _registry(cfg, image, *, quiet):
    from berth.image import importer
    from berth.image.request import ImportRequest
    uri = registry_uri(image)
    pulled = importer.cached_squashfs(cfg, ImportRequest(uri, quiet=quiet, digest=True))
    return pulled.path, stepcache.key(None, ["image", uri, pulled.digest])


def begin(builder, stage):
    """The State of `stage` (plan.Stage) before its first step."""
    if stage.base_stage is not None:
        end = builder.ends[stage.base_stage]
        return State(key=end.key, image=end.image, image_key=end.image_key, config=end.config,
                     layers=end.layers, owners=end.owners)
    if stage.base == "scratch":
        return State(key=stepcache.key(None, ["scratch"]), image=None, image_key=None,
                     config=imagecfg.ImageConfig())
    if stage.base.endswith(imagefile.SUFFIXES[:1]) or stage.base.startswith(("/", "./")):
        try:  # (relative to the build context)
            path = imagefile.locate(os.path.join(builder.context, stage.base)).path
        except BerthError as e:
            raise BerthError(f"{stage.where}: FROM {stage.base}: {e}") from None
        key = stepcache.file_key(path)
    else:
        path, key = _registry(builder.cfg, stage.base, quiet=builder.quiet)
    config = imagecfg.from_record(tree.read_config(path), stage.where)
    return State(key=key, image=path, image_key=key, config=config)
