"""`berth build [-f FILE] [--build-arg K=V]... [--target STAGE] [--no-cache]
[-o OUT.sqsh|oci:DIR|oci-archive:FILE] [--push docker://REGISTRY#REPO[:TAG]]
CONTEXT`: parse, plan, run the stages' steps, write the image, push it.
Everything a build unpacks lives in one directory of ENROOT_TEMP_PATH,
removed however the build ends (an error, SIGINT); the output appears
whole or not at all, and a push's tag changes last."""

import os
import sys
import tempfile
import time
import typing

from berth.build import (
    base,
    config as imagecfg,
    ignore,
    instructions,
    layers,
    oci,
    outputs,
    parse,
    plan,
    stepcache,
    tree,
)
from berth.build.steps import Builder, write_record
from berth.errors import BerthError
from berth.image import imageconfig, push


class BuildRequest(typing.NamedTuple):
    context: str
    file: str = None
    build_arg: tuple = ()
    target: str = None
    no_cache: bool = False
    output: str = None
    quiet: bool = False
    base: str = None  # the first FROM's image in place of the file's (an EDF's `image`)
    push: str = None  # docker://[USER@]REGISTRY#REPO[:TAG] to upload the image to


class Built(typing.NamedTuple):
    """What a build gave: the image cache's squashfs, its steps' counts, and
    for an OCI image, its history (oci.Entry) and configuration."""

    path: str
    steps: int
    ran: int
    cached: int
    history: list = []
    config: imagecfg.ImageConfig = None


class Options(typing.NamedTuple):
    """The request, checked: what the Builder reads."""

    context: str
    file: str
    build_args: dict
    target: str
    no_cache: bool
    quiet: bool
    ignore: ignore.Ignore  # or None: every file of the context is seen


def _options(request):
    context = os.path.abspath(request.context)
    if not os.path.isdir(context):
        raise BerthError(f"{request.context}: the build context is not a directory")
    file = request.file or next((os.path.join(context, name) for name in
                                 ("Containerfile", "Dockerfile")
                                 if os.path.lexists(os.path.join(context, name))), None)
    if file is None:
        raise BerthError(f"{request.context}: no Containerfile or Dockerfile (give -f FILE)")
    build_args = {}
    for spec in request.build_arg:
        name, equals, value = spec.partition("=")
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise BerthError(f"--build-arg {spec!r}: expected NAME=VALUE")
        if "\n" in value or "\0" in value:
            raise BerthError(f"--build-arg {name}: the value holds a newline or NUL")
        build_args[name] = value if equals else os.environ.get(name, "")
    return Options(context=context, file=file, build_args=build_args, target=request.target,
                   no_cache=request.no_cache, quiet=request.quiet,
                   ignore=ignore.find(context, file))


def _stages(builder, build_plan):
    """The last stage's index, and each stage's history (oci.Entry lists)."""
    histories = {}
    for stage in build_plan.stages:
        named = stage.name and stage.name != stage.base.lower()  # (an image taken --from)
        builder.say(f"FROM {stage.base}" + (f" AS {stage.name}" if named else ""))
        state = base.begin(builder, stage)  # (a pull's progress after its line)
        history = oci.begun(stage, state, histories)
        triggers, state = instructions.triggers(builder, stage, state)
        _check_runnable_temp(builder.cfg, triggers, triggers=True)
        for step in [*triggers, *stage.steps]:
            before, state = state, instructions.apply(builder, step, state, stage=stage.index)
            history.append(oci.after(step, before, state))
        builder.ends[stage.index], histories[stage.index] = state, history
    return build_plan.stages[-1].index, histories


def _write(builder, stage, options):
    """The image: the last state's root with its record and WORKDIR's
    directory, from the cache or packed into it (that change kept as a
    layer too, as a step's is); its oci.Entry."""
    state = builder.ends[stage]
    source = f"berth build {options.file}"
    record = imagecfg.record(state.config, source)
    key = stepcache.key(state.key, ["image", record])
    found = None if options.no_cache else stepcache.found_step(builder.cfg, key)
    if not found:
        root, before = builder.tree_to_change(stage, state)
        if state.config.workdir:
            os.makedirs(tree.path_in(root, state.config.workdir), mode=0o755, exist_ok=True)
        write_record(root, state, source)
        found = stepcache.path(builder.cfg, key)
        layer = layers.write(builder.cfg, root, layers.changes(before, layers.snapshot(root)),
                             owners=state.owners)
        tree.pack(root, found, builder.cfg)
        layers.keep(builder.cfg, key, layer)
    return oci.Entry(f"berth build: WORKDIR and {imageconfig.IMAGE_JSON}", key=key, image=found)


def _check_runnable_temp(cfg, steps, *, triggers=False):
    """Refuse `steps` (the plan's, a base image's triggers) with a RUN among
    them when ENROOT_TEMP_PATH, where the stages' trees are unpacked and
    RUN runs its programs, is on a file system mounted noexec: each would
    fail with a bare EACCES."""
    first = next((step for step in steps if step.cmd == "RUN"), None)
    temp = cfg["ENROOT_TEMP_PATH"]
    try:
        noexec = first is not None and os.statvfs(temp).f_flag & os.ST_NOEXEC
    except OSError:  # (mkdtemp says what is wrong with it)
        return
    if noexec:
        what = f"the base image's trigger ONBUILD {first.original}" if triggers else "RUN"
        raise BerthError(f"{first.where}: {what} needs ENROOT_TEMP_PATH ({temp}) on a file "
                         "system that allows running programs; it is mounted noexec")


def build(cfg, request):
    """Build what the BuildRequest `request` asks for into the image cache: a Built."""
    options = _options(request)
    build_plan = plan.make(parse.read(options.file), build_args=options.build_args,
                           target=options.target, base=request.base)
    _check_runnable_temp(cfg, [step for stage in build_plan.stages for step in stage.steps])
    try:  # (a private directory of its own, whoever else uses ENROOT_TEMP_PATH)
        work = tempfile.mkdtemp(prefix="berth-build.", dir=cfg["ENROOT_TEMP_PATH"])
    except OSError as e:
        raise BerthError(f"ENROOT_TEMP_PATH {cfg['ENROOT_TEMP_PATH']}: {e.strerror}") from None
    try:
        builder = Builder(cfg, options=options, plan=build_plan, work=work)
        last, histories = _stages(builder, build_plan)
        image = _write(builder, last, options)
    finally:
        tree.remove(work)
    return Built(path=image.image, steps=builder.total, ran=builder.ran, cached=builder.cached,
                 history=[*histories[last], image], config=builder.ends[last].config)


def _pushed(cfg, request, *, built, ref):
    """The built image uploaded to `ref` (push.target's): where, for the summary."""
    image = oci.image(cfg, history=built.history, config=built.config)
    pushed = push.push(cfg, ref, image, quiet=request.quiet)
    return (f"{ref} ({pushed.uploaded} blobs uploaded, {pushed.present} there already, "
            f"manifest {image.manifest.digest})")


def cmd_build(request, cfg):
    """Build, then write -o's output (image.sqsh without -o or --push), then
    push: both where both are asked for."""
    began = time.monotonic()
    # (both checked before any step runs)
    ref = push.target(request.push) if request.push else None
    target = outputs.target(request.output) if request.output or not ref else None
    built = build(cfg, request)
    shown = []
    if target is not None and target.kind == "squashfs":
        outputs.write_squashfs(target, built.path)
    elif target is not None:
        outputs.write_oci(target, oci.image(cfg, history=built.history, config=built.config))
    if target is not None:
        shown.append(target.path)
    if ref is not None:
        shown.append(_pushed(cfg, request, built=built, ref=ref))
    if not request.quiet:
        print(f"berth build: {', '.join(shown)}: {built.steps} steps, {built.ran} run, "
              f"{built.cached} cached ({time.monotonic() - began:.1f} s)", file=sys.stderr)
    return 0
