"""Where an EDF's built image goes for its job's nodes (BERTH_EDF_BUILD_PATH).

`srun --environment=E` resolves E once, at submission on the node it is
run on: an EDF with a `containerfile` is built there (site/edf.py), into
the user's image cache, which is the node's own. The job's nodes read the
image from BERTH_EDF_BUILD_PATH: a directory of the user's own on a
filesystem they all mount, where the image is copied once under its
build's key (the last step's), so the same build is copied once and a
changed one is another file. The directory is checked and made as the
user's own directories are (safedir: 0700, owned by the user, writable by
nobody else, in a parent no one else may replace it in), so no other user
can read the build or plant one in its place.

The shared image store does not take built images: its entries are
registry images every user may ask for by name, written by the store's
account alone, which takes nothing from a user's files. A build meant for
everyone is pushed (`berth build --push`) and the store pulls it.
"""

import os
import stat

from berth import safedir
from berth.errors import BerthError
from berth.image import squash

KEY = "BERTH_EDF_BUILD_PATH"


def placed(cfg, image):
    """The path the job's nodes read the built squashfs `image` (of the
    user's image cache) at: its copy in BERTH_EDF_BUILD_PATH, or `image`
    itself where that is empty."""
    directory = cfg[KEY].strip()
    if not directory:
        return image
    if not os.path.isabs(directory):
        raise BerthError(f"{KEY}={directory}: not an absolute path")
    safedir.ensure(directory, KEY)
    copy = os.path.join(directory, os.path.basename(image))
    if not _same(copy, image):
        try:
            squash.copy_image(image, copy, True)
        except OSError as e:
            raise BerthError(f"{KEY} {directory}: cannot write {os.path.basename(image)}: "
                             f"{e.strerror}") from None
    return copy


def _same(copy, image):
    """Whether `copy` is already the whole copy of `image`: a regular file
    (never a link) of its size. Its name is the build's key, and only its
    user writes the directory."""
    try:
        found = os.lstat(copy)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_size == os.stat(image).st_size
