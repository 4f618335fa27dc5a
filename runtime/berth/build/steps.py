"""The steps of a build's stages, run in order: each takes the State the
step before it left and gives the next. A step that changes the root
(RUN, COPY, ADD) is looked up in the step cache by its key first
(stepcache.py) and, when missing, run in the stage's tree, its change
kept in the cache as a layer (layers.py); the others change the image
configuration only. A stage's tree is unpacked when a step must run: its
base, then the cached steps' layers above it (restore.py), and kept for
the stage's next step."""

import os
import sys
import typing

from berth.build import (
    config as imagecfg,
    context,
    layers,
    owners as owned,
    restore,
    stepcache,
    tree,
    words,
)
from berth.image import imageconfig

# BuildKit's predefined proxy arguments: passed to RUN, kept out of the key
PROXIES = tuple(n for name in ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY")
                for n in (name, name.lower()))


class State(typing.NamedTuple):
    key: str          # the key of the last step
    image: str        # the squashfs of the stage's base (None: an empty root)
    image_key: str    # the key of that base
    config: imagecfg.ImageConfig
    args: dict = {}   # the stage's ARGs in scope: name -> value (None: declared, unset)
    cmd_here: bool = False  # CMD was set in this stage (ENTRYPOINT then keeps it)
    layers: tuple = ()  # the keys of the changing steps over the base, in order
    owners: dict = {}  # path in the root -> owners.Owner, where COPY --chown gave one

    @property
    def root_at(self):
        """What the root is made of: the base's key and the steps' over it."""
        return (self.image_key, self.layers)


class StageFiles(typing.NamedTuple):
    """What COPY --from copies of an earlier stage."""

    checksum: str                # context.checksum of the sources
    sources: typing.Callable     # () -> the context.Source list, from the stage's tree


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
        """The stage's tree as `state` has it: the one it has, with the
        layers of the steps cached since; else unpacked anew."""
        path, at, _ = self.trees.get(stage, (None, None, None))
        base_key, keys = state.root_at
        if path and at and at[0] == base_key and keys[:len(at[1])] == at[1]:
            if keys == at[1]:
                return path
            self.trees[stage] = (path, None, None)  # (until it is whole)
            restore.apply_steps(self.cfg, path, keys[len(at[1]):])
            self.trees[stage] = (path, state.root_at, None)
            return path
        if path:
            tree.remove(path)
        path = f"{self.work}/stage-{stage}"
        self.trees[stage] = (None, None, None)  # (until it is whole)
        if state.image:
            tree.unpack(state.image, path)
        else:
            os.mkdir(path, 0o700)
        restore.apply_steps(self.cfg, path, keys)
        self.trees[stage] = (path, state.root_at, None)
        return path

    def tree_to_change(self, stage, state):
        """The stage's tree as `state` has it, and a layers.Snapshot of it:
        the one the step before took after its change where the tree is
        that step's still (a walk saved), else taken now. The tree is the
        caller's to change: it no longer stands for `state`."""
        root = self.tree_at(stage, state)
        _, _, taken = self.trees[stage]
        self.trees[stage] = (root, None, None)
        return root, taken or layers.snapshot(root)

    def stage_files(self, stage, specs, *, where):
        """The StageFiles of `specs` in the stage `stage` as it ended: the
        checksum remembered for that root where it was taken before, so a
        cached COPY --from unpacks nothing."""
        state = self.ends[stage]

        def sources():
            return context.gather(specs, context=None, where=where,
                                  root=self.tree_at(stage, state))

        memo = stepcache.sums_memo(self.cfg, root_at=state.root_at, image=state.image,
                                   specs=specs)
        found = stepcache.found_sum(self.cfg, memo) if memo else None
        if found is None:
            found = context.checksum(sources())
            if memo:
                stepcache.keep_sum(self.cfg, memo, found)
        return StageFiles(checksum=found, sources=sources)

    def changed(self, stage, state, *, step, key, change):
        """The State after `step`, which changes the root: from the cache,
        or `change(root)` run in the stage's tree, its layer kept in the cache;
        `change` may return the owners ({path: owners.Owner}) it gave."""
        found = not self.no_cache and stepcache.found_layer(self.cfg, key)
        self.say(step.original, cached=found)
        if found:
            self.cached += 1
            return state._replace(key=key, layers=(*state.layers, key),
                                  owners=owned.found(self.cfg, key))
        root, before = self.tree_to_change(stage, state)
        if state.config.workdir:  # (WORKDIR's directory is made here, as BuildKit does)
            os.makedirs(tree.path_in(root, state.config.workdir), mode=0o755, exist_ok=True)
        try:
            given = change(root) or {}
        except BaseException:  # (a failed or stopped RUN's tree is removed all the same)
            tree.owner_writable(root)
            raise
        after = layers.snapshot(root)
        owners = {path: owner for path, owner in {**state.owners, **given}.items()
                  if path in after.entries and tuple(owner) != (0, 0)}
        layer = layers.write(self.cfg, root, layers.changes(before, after), owners=owners)
        owned.keep(self.cfg, key, owners)
        layers.keep(self.cfg, key, layer)
        new = state._replace(key=key, layers=(*state.layers, key), owners=owners)
        self.trees[stage] = (root, new.root_at, after)
        self.ran += 1
        return new

    def expand(self, text, state, where):
        return words.one(text, env=variables(state), where=where, escape=self.escape)

    def split(self, text, state, where):
        return words.split(text, env=variables(state), where=where, escape=self.escape)


def variables(state):
    """What $VAR expands from: the ARGs set, the ENV over them."""
    return {**{k: v for k, v in state.args.items() if v is not None}, **state.config.env}


def write_record(root, state, source):
    imageconfig.write_image_config(root, imagecfg.record(state.config, source))
