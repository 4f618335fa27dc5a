"""A parsed Containerfile made into the stages a build runs: each FROM
begins one, the ARGs before the first FROM are the global ones its image
may use, and --target (or the last stage) names what is built: that stage
and the stages it takes from (FROM STAGE, COPY --from=STAGE), in order,
after a stage of no steps for each image a step takes from by name.
What berth build does not do is refused here, naming the file and line,
before anything runs."""

import typing

from berth.build import parse, recorded, runflags, words
from berth.errors import BerthError

# instruction -> the flags it takes here
_FLAGS = {"RUN": ("mount", "network"), "COPY": ("from", "chown", "chmod"),
          "ADD": ("chown", "chmod", "checksum"), "ENV": (), "ARG": (), "WORKDIR": (), "USER": (),
          "SHELL": (), "LABEL": (), "CMD": (), "ENTRYPOINT": (), "EXPOSE": (), "VOLUME": (),
          "STOPSIGNAL": (), "HEALTHCHECK": (*recorded.DURATIONS, "retries"), "ONBUILD": ()}
_LATER = ("MAINTAINER",)  # known to BuildKit, not done by berth build yet
_JSON_FORMS = ("RUN", "CMD", "ENTRYPOINT", "SHELL", "COPY", "ADD", "VOLUME", "HEALTHCHECK")


class Stage(typing.NamedTuple):
    index: int
    name: str        # its AS name, lower case, or None
    base: str        # the image (expanded from the global ARGs), or a stage's name/index
    base_stage: int  # the stage FROM names, or None for an image
    where: str
    steps: list      # its instructions (parse.Instruction), FROM not counted


class Plan(typing.NamedTuple):
    stages: list     # the stages to build, in order; the last is the target
    escape: str
    global_args: dict  # name -> value of the ARGs before the first FROM


def _flag_names(instruction):
    names = []
    for flag in instruction.flags:
        name = flag[2:].partition("=")[0]
        if not flag.startswith("--") or name not in _FLAGS[instruction.cmd]:
            raise BerthError(f"{instruction.where}: {instruction.cmd} {flag.partition('=')[0]}: "
                             "not supported by berth build")
        names.append(name)
    return names


def check(instruction):
    """Refuse what berth build does not do, and what BuildKit refuses too."""
    cmd, where = instruction.cmd, instruction.where
    if cmd == "ONBUILD":
        recorded.check_trigger(instruction)
        check(parse.trigger(recorded.trigger_text(instruction), where))
        return
    if cmd in _LATER:
        raise BerthError(f"{where}: {cmd}: not supported by berth build")
    if cmd not in _FLAGS:
        raise BerthError(f"{where}: unknown instruction '{cmd}'")
    _flag_names(instruction)
    if not instruction.value and cmd not in ("CMD", "ENTRYPOINT"):
        raise BerthError(f"{where}: {cmd} needs arguments")
    if instruction.json and cmd not in _JSON_FORMS:
        raise BerthError(f"{where}: {cmd} has no JSON form")
    if cmd in ("COPY", "ADD") and len(instruction.value) < 2:
        raise BerthError(f"{where}: {cmd} needs a source and a destination")
    if cmd == "SHELL" and not instruction.json:
        raise BerthError(f"{where}: SHELL takes the JSON form only")
    if cmd == "RUN":  # (a value with a variable is read when the step runs)
        runflags.read([f for f in instruction.flags if "$" not in f], where)


def _from(instruction, global_args, *, escape, named):
    """(image, AS name, stage index) of a FROM line."""
    if instruction.flags:
        raise BerthError(f"{instruction.where}: FROM {instruction.flags[0].partition('=')[0]}: "
                         "not supported by berth build")
    value = instruction.value
    if len(value) not in (1, 3) or len(value) == 3 and value[1].lower() != "as":
        raise BerthError(f"{instruction.where}: expected FROM IMAGE [AS NAME]")
    image = words.one(value[0], env=global_args, where=instruction.where, escape=escape)
    if not image:
        raise BerthError(f"{instruction.where}: FROM {value[0]}: the image name is empty")
    name = value[2].lower() if len(value) == 3 else None
    if name is not None and (name in named or name.isdigit() or not name.isprintable()):
        raise BerthError(f"{instruction.where}: FROM ... AS {value[2]}: a stage name must "
                         "be unique and not a number")
    return image, name, named.get(image.lower())


def _global_args(instructions, build_args, escape):
    args = {}
    for instruction in instructions:
        if instruction.cmd != "ARG":
            raise BerthError(f"{instruction.where}: only ARG may come before the first FROM")
        for spec in instruction.value:
            name, equals, default = spec.partition("=")
            value = build_args.get(name, words.one(default, env=args, where=instruction.where,
                                                   escape=escape) if equals else None)
            if value is not None:
                args[name] = value
    return args


def make(containerfile, *, build_args, target, base=None):
    """The Plan of `containerfile` (parse.Containerfile) for `target` (a
    stage name, or None: the last stage); `base`, where given, is the first
    FROM's image in place of the one the file names (an EDF's `image`)."""
    instructions, escape = containerfile.instructions, containerfile.escape
    first = next((i for i, ins in enumerate(instructions) if ins.cmd == "FROM"), None)
    if first is None:
        raise BerthError(f"{containerfile.path}: no FROM instruction")
    global_args = _global_args(instructions[:first], build_args, escape)
    stages, named = [], {}
    for instruction in instructions[first:]:
        if instruction.cmd == "FROM":
            image, name, base_stage = _from(instruction, global_args, escape=escape, named=named)
            stages.append(Stage(index=len(stages), name=name, base=image, base_stage=base_stage,
                                where=instruction.where, steps=[]))
            named[str(len(stages) - 1)] = len(stages) - 1
            if name:
                named[name] = len(stages) - 1
            continue
        check(instruction)
        stages[-1].steps.append(instruction)
    if base is not None:
        stages[0] = stages[0]._replace(base=base)
    if target is not None and target.lower() not in named:
        raise BerthError(f"--target {target}: no stage of that name in {containerfile.path}")
    chosen = named[target.lower()] if target is not None else len(stages) - 1
    return Plan(stages=_needed(stages, chosen, named), escape=escape, global_args=global_args)


def _needed(stages, chosen, named):
    """The stages `chosen` takes from, itself last, in the file's order;
    before them, a stage of no steps for each image a step takes from by
    name (`COPY --from=IMAGE`, `RUN --mount=from=IMAGE`), as BuildKit
    reads a name that is no stage's."""
    wanted, pending, images = set(), [chosen], {}
    while pending:
        index = pending.pop()
        if index in wanted:
            continue
        wanted.add(index)
        stage = stages[index] if index < len(stages) else None
        if stage is None:
            continue
        if stage.base_stage is not None:
            pending.append(stage.base_stage)
        for step in stage.steps:
            for shown, source in taken_from(step):
                pending.append(_source_stage(source, step, shown, index=index, named=named,
                                             images=images, count=len(stages)))
    return [*images.values(), *(stage for stage in stages if stage.index in wanted)]


def _source_stage(source, step, shown, *, index, named, images, count):
    """The index of the stage `source` names for a step of stage `index`: an
    earlier stage, or an image's stage of no steps (made in `images` the
    first time, numbered from `count` on)."""
    name = source.lower()
    if name in images or name in named and named[name] < index:
        return named[name]
    if name in named or name.isdigit() or not source or "$" in source:
        raise BerthError(f"{step.where}: {step.cmd} {shown}: no earlier stage of that name")
    if name not in images:
        images[name] = Stage(index=count + len(images), name=name, base=source,
                             base_stage=None, where=step.where, steps=[])
        named[name] = images[name].index
    return named[name]


def taken_from(step):
    """(as shown, name) of each stage a step takes files from: COPY --from,
    RUN --mount from=."""
    if step.cmd == "RUN":
        return [(f"--mount from={name}", name) for name in runflags.stages_named(step.flags)]
    return [(f, f[7:]) for f in step.flags if f.startswith("--from=")]
