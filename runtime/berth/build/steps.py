"""The steps of a build's stages, run in order: each takes the State the
step before it left and gives the next. A step that changes the root
(RUN, COPY, ADD) is looked up in the step cache by its key first
(stepcache.py) and, when missing, run in the stage's tree, which is then
packed into the cache; the others change the image configuration only."""

import os
import sys
import typing

from berth.build import config as imagecfg, layers, owners as owned, stepcache, tree, words
from berth.image import imageconfig

# BuildKit's predefined proxy arguments: passed to RUN, kept out of the key
PROXIES = tuple(n for name in ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
                for n in (name, name.lower()))


class State(typing.NamedTuple):
    key: str          # the key of the last step
    image: str        # the squashfs of the root as it now is (None: an empty root)
    image_key: str    # the step key that squashfs is of
    config: imagecfg.ImageConfig
    args: dict = {}   # the stage's ARGs in scope: name -> value (None: declared, unset)
    cmd_here: bool = False  # CMD was set in this stage (ENTRYPOINT then keeps it)
    owners: dict = {}  # path in the root -> owners.Owner, where COPY --chown gave one


class Builder:
    """One build's steps: the trees it unpacked, the stages' ends, counts."""

    __slots__ = ("cfg", "context", "escape", "build_args", "global_args", "no_cache",
                 "quiet", "ignore", "work", "trees", "ends", "ran", "cached", "number", "total",
                 "named")

    def __init__(self, cfg, *, options, plan, work):
        self.cfg, self.work = cfg, work
        self.context, self.no_cache, self.quiet = options.context, options.no_cache, options.quiet
        self.build_args, self.ignore = options.build_args, options.ignore
        self.escape, self.global_args = plan.escape, plan.global_args
        self.trees, self.ends = {}, {}
        self.ran = self.cached = self.number = 0
        self.total = sum(len(stage.steps) + 1 for stage in plan.stages)
        self.named = {str(stage.index): stage.index for stage in plan.stages}
        self.named.update((stage.name, stage.index) for stage in plan.stages if stage.name)

    def stage_named(self, name):
        """The index of the stage `name` (an AS name or a number) names."""
        return self.named[name.lower()]

    def say(self, step_text, cached=False):
        self.number += 1
        if not self.quiet:
            shown = step_text.splitlines()[0] if step_text else ""
            print(f"[{self.number}/{self.total}] {shown}{' (cached)' if cached else ''}",
                  file=sys.stderr, flush=True)

    def tree_at(self, stage, state):
        """The stage's tree as `state` has it, unpacked when it is not."""
        path, at = self.trees.get(stage, (None, None))
        if path and at == state.image_key:
            return path
        if path:
            tree.remove(path)
        path = f"{self.work}/stage-{stage}"
        if state.image:
            tree.unpack(state.image, path)
        else:
            os.mkdir(path, 0o700)
        self.trees[stage] = (path, state.image_key)
        return path

    def changed(self, stage, state, *, step, key, change):
        """The State after `step`, which changes the root: from the cache,
        or `change(root)` run in the stage's tree, packed into the cache;
        `change` may return the owners ({path: owners.Owner}) it gave."""
        found = None if self.no_cache else stepcache.found_step(self.cfg, key)
        self.say(step.original, cached=bool(found))
        if found:
            self.cached += 1
            return state._replace(key=key, image=found, image_key=key,
                                  owners=owned.found(self.cfg, key))
        root = self.tree_at(stage, state)
        before = layers.snapshot(root)
        if state.config.workdir:  # (WORKDIR's directory is made here, as BuildKit does)
            os.makedirs(tree.path_in(root, state.config.workdir), mode=0o755, exist_ok=True)
        try:
            given = change(root) or {}
        finally:  # (a failed or stopped RUN's tree is removed all the same)
            tree.owner_writable(root)
        output = stepcache.path(self.cfg, key)
        after = layers.snapshot(root)
        owners = {path: owner for path, owner in {**state.owners, **given}.items()
                  if path in after.entries and tuple(owner) != (0, 0)}
        layer = layers.write(self.cfg, root, layers.changes(before, after), owners=owners)
        tree.pack(root, output, self.cfg)
        owned.keep(self.cfg, key, owners)
        layers.keep(self.cfg, key, layer)
        self.trees[stage] = (root, key)
        self.ran += 1
        return state._replace(key=key, image=output, image_key=key, owners=owners)

    def expand(self, text, state, where):
        return words.one(text, env=variables(state), where=where, escape=self.escape)

    def split(self, text, state, where):
        return words.split(text, env=variables(state), where=where, escape=self.escape)


def variables(state):
    """What $VAR expands from: the ARGs set, the ENV over them."""
    return {**{k: v for k, v in state.args.items() if v is not None}, **state.config.env}


def write_record(root, state, source):
    imageconfig.write_image_config(root, imagecfg.record(state.config, source))
