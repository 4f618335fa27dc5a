"""What each instruction does to a stage's State (steps.py): the image
configuration ones (ENV, ARG, WORKDIR, USER, SHELL, LABEL, CMD, ENTRYPOINT,
EXPOSE, VOLUME, STOPSIGNAL) change it and the key; RUN, COPY and ADD
change the root, through Builder.changed and its cache."""

import os
import posixpath

from berth.build import (
    archive,
    context,
    fetch,
    owners,
    parse,
    plan,
    recorded,
    run,
    runflags,
    runmounts,
    stepcache,
)
from berth.build.steps import PROXIES, variables, write_record
from berth.errors import BerthError


def _pairs(builder, step, state):
    """ENV and LABEL's KEY VALUE pairs, expanded."""
    values = step.value
    if len(values) % 2:
        raise BerthError(f"{step.where}: {step.cmd}: expected KEY=VALUE pairs")
    return [(builder.expand(values[i], state, step.where),
             builder.expand(values[i + 1], state, step.where)) for i in range(0, len(values), 2)]


def _env(builder, step, state, *, stage):
    env = {**state.config.env}
    for name, value in _pairs(builder, step, state):
        if not name or "\0" in value or "\n" in value:
            raise BerthError(f"{step.where}: ENV {name}: an empty name, or a newline or NUL "
                             "in the value")
        env[name] = value
    return state._replace(config=state.config._replace(env=env))


def _label(builder, step, state, *, stage):
    labels = {**state.config.labels, **dict(_pairs(builder, step, state))}
    return state._replace(config=state.config._replace(labels=labels))


def _arg(builder, step, state, *, stage):
    args = {**state.args}
    for spec in step.value:
        name, equals, default = spec.partition("=")
        if name in builder.build_args:
            args[name] = builder.build_args[name]
        elif equals:
            args[name] = builder.expand(default, state, step.where)
        else:
            args[name] = builder.global_args.get(name)
    return state._replace(args=args)


def _workdir(builder, step, state, *, stage):
    path = builder.expand(step.value[0], state, step.where)
    path = posixpath.normpath(posixpath.join("/", state.config.workdir or "/", path))
    return state._replace(config=state.config._replace(workdir=path))


def _user(builder, step, state, *, stage):
    return state._replace(config=state.config._replace(
        user=builder.expand(step.value[0], state, step.where)))


def _shell(builder, step, state, *, stage):
    return state._replace(config=state.config._replace(shell=tuple(step.value)))


def _command(step, state):
    """CMD and ENTRYPOINT's argv: the JSON form as it is, else through SHELL."""
    if step.json:
        return list(step.value)
    return [*state.config.shell, " ".join(step.value)] if step.value else None


def _cmd(builder, step, state, *, stage):
    return state._replace(config=state.config._replace(cmd=_command(step, state)),
                          cmd_here=True)


def _entrypoint(builder, step, state, *, stage):
    cmd = state.config.cmd if state.cmd_here else None  # (BuildKit's rule)
    return state._replace(config=state.config._replace(entrypoint=_command(step, state),
                                                       cmd=cmd))


def _expose(builder, step, state, *, stage):
    ports = []
    for port in builder.split(" ".join(step.value), state, step.where):
        number, _, protocol = port.partition("/")
        if not number.isdigit() or protocol not in ("", "tcp", "udp", "sctp"):
            raise BerthError(f"{step.where}: EXPOSE {port}: expected PORT[/tcp|udp|sctp]")
        ports.append(f"{int(number)}/{protocol or 'tcp'}")
    expose = tuple(dict.fromkeys([*state.config.expose, *ports]))
    return state._replace(config=state.config._replace(expose=expose))


def _volume(builder, step, state, *, stage):
    found = list(step.value) if step.json else builder.split(" ".join(step.value), state,
                                                                step.where)
    volumes = tuple(dict.fromkeys([*state.config.volumes, *found]))
    return state._replace(config=state.config._replace(volumes=volumes))


def _stopsignal(builder, step, state, *, stage):
    return state._replace(config=state.config._replace(
        stopsignal=builder.expand(step.value[0], state, step.where)))


def _script(step):
    """A shell-form RUN's script: its heredoc's text when the heredoc is the
    command, else the line with its heredocs, which the shell reads."""
    line = " ".join(step.value)
    if step.heredocs and line == f"<<{step.heredocs[0].name}" and len(step.heredocs) == 1:
        return step.heredocs[0].content
    return line + "".join(f"\n{h.content}{h.name}" for h in step.heredocs)


def _run(builder, step, state, *, stage):
    run.check_user(state.config.user, step.where)
    command = list(step.value) if step.json else [*state.config.shell, _script(step)]
    env = {"HOME": "/root", **variables(state)}
    flags = runflags.read(step.flags, step.where,
                          expand=lambda text: builder.expand(text, state, step.where))
    bounds = runmounts.gather(builder, flags, where=step.where)
    what = ["RUN", command, env, state.config.workdir]
    if flags != runflags.RunFlags():  # (a RUN without flags keeps the key it had)
        what += [flags.network, [bound.key for bound in bounds]]
    key = stepcache.key(state.key, what)
    proxies = {name: builder.build_args.get(name, os.environ.get(name)) for name in PROXIES}

    def change(root):
        write_record(root, state, "berth build")
        with runmounts.mounted(builder, bounds, root=root) as found:
            status = run.run(builder.cfg, root=root, command=command, quiet=builder.quiet,
                             env={**env, **{k: v for k, v in proxies.items() if v is not None}},
                             extra=run.Extra(network=flags.network, mounts=tuple(found)))
        if status:
            shown = " ".join(step.value).splitlines()[0]
            raise BerthError(f"{step.where}: RUN {shown} exited with status {status}")

    return builder.changed(stage, state, step=step, key=key, change=change)


def _chmod(step):
    for flag in step.flags:
        if flag.startswith("--chmod="):
            mode = flag[8:]
            if not mode or any(c not in "01234567" for c in mode) or int(mode, 8) > 0o7777:
                raise BerthError(f"{step.where}: {step.cmd} {flag}: expected an octal mode")
            return int(mode, 8)
    return None


def _sources(builder, step, state, *, specs):
    """The checksum of a COPY/ADD's sources, a function giving them (a
    heredoc's text, an earlier stage's files (--from) or the context's) and
    the key of the stage they come from (None: the context)."""
    origin = next((f[7:] for f in step.flags if f.startswith("--from=")), None)
    heredocs = {f"<<{h.name}": h for h in step.heredocs}
    if origin is not None:
        stage = builder.stage_named(origin)
        found = builder.stage_files(stage, specs, where=step.where)
        return found.checksum, found.sources, builder.ends[stage].key
    found = []
    for spec in specs:
        if fetch.is_url(spec):
            found.append(fetch.source(builder.cfg, spec, where=step.where, work=builder.work,
                                      quiet=builder.quiet))
        elif spec in heredocs:
            path = f"{builder.work}/heredoc-{len(os.listdir(builder.work))}"
            with open(path, "w", encoding="utf-8") as f:
                f.write(heredocs[spec].content)
            entry = context.Entry(path=path, name="", kind="file", mode=0o644, target="")
            found.append(context.Source(spec, False, [entry]))
        else:
            found += context.gather([spec], context=builder.context, where=step.where,
                                    ignore=builder.ignore)
    return context.checksum(found), lambda: found, None


def _archives(sources, step):
    """ADD's sources that are local tar archives (unpacked, not copied)."""
    found = []
    for source in sources if step.cmd == "ADD" else ():
        entry = source.entries[0]
        if entry.kind == "file" and not source.spec.startswith("<<") \
                and not fetch.is_url(source.spec):  # (BuildKit unpacks no URL's file)
            with context.open_file(entry) as opened:
                if archive.is_archive(opened):
                    found.append(source)
    return found


def _copy(builder, step, state, *, stage):
    chown = owners.flag(step, lambda text: builder.expand(text, state, step.where))
    mode = _chmod(step)
    if step.json:  # (its strings may hold spaces; each is expanded as it is)
        args = [builder.expand(value, state, step.where) for value in step.value]
    else:
        args = builder.split(" ".join(step.value), state, step.where)
    specs, dest = args[:-1], args[-1]
    fetch.check_specs(step, specs)
    fetched = fetch.checksum_flag(step, specs) if step.cmd == "ADD" else None
    # (a URL is fetched at each build, its content in the key, as BuildKit
    # does; with --checksum, only when the step runs)
    checksum, gathered, origin_key = (context.checksum([]), list, None) if fetched else \
        _sources(builder, step, state, specs=specs)
    target = posixpath.join(state.config.workdir or "/", dest)
    if dest.endswith("/") or dest in (".", ".."):
        target = target.rstrip("/") + "/"
    what = [step.cmd, checksum, target, mode, origin_key]
    what += [chown] if chown is not None else []
    key = stepcache.key(state.key, what + ([specs[0], fetched] if fetched else []))

    def change(root):
        owner = None if chown is None else owners.resolve(
            root, chown, where=step.where, shown=f"{step.cmd} --chown={chown}")
        sources = gathered()  # (COPY --from: only now is its stage's tree unpacked)
        archives = _archives(sources, step)
        made = []
        for source in archives:
            with context.open_file(source.entries[0]) as opened:
                made += archive.unpack(opened, root=root, dest=target, where=step.where,
                                       spec=source.spec)
        plain = [source for source in sources if source not in archives]
        if fetched:
            plain = [fetch.source(builder.cfg, specs[0], where=step.where, work=builder.work,
                                  quiet=builder.quiet, checksum=fetched)]
        into = target if len(archives) + len(plain) == 1 or target.endswith("/") \
            else target + "/"
        made += _place(plain, root=root, into=into, mode=mode)
        return _owned(root, made, owner=owner, kept=_stage_owners(builder, step))

    return builder.changed(stage, state, step=step, key=key, change=change)


def _place(sources, *, root, into, mode):
    """`sources` copied to `into`: what was made (context.Placed)."""
    made = []
    for source in sources:
        placed = context.copy([source], root=root, dest=into, chmod=mode)
        if fetch.is_url(source.spec):  # (its Last-Modified, as BuildKit keeps it)
            os.utime(placed[0].path, ns=(os.stat(source.entries[0].path).st_mtime_ns,) * 2,
                     follow_symlinks=False)
        made += placed
    return made


def _stage_owners(builder, step):
    """What gives a copied context.Entry's owner in the stage COPY --from
    takes it from (BuildKit keeps it, but for a directory copied as a
    whole: its own directory is made anew, root's), None where root's."""
    origin = next((f[7:] for f in step.flags if f.startswith("--from=")), None)
    if origin is None:
        return lambda entry: None
    stage = builder.stage_named(origin)
    root, held = builder.tree_at(stage, builder.ends[stage]), builder.ends[stage].owners
    return lambda entry: None if entry.kind == "dir" and not entry.name else \
        held.get(os.path.relpath(entry.path, root))


def _owned(root, made, *, owner, kept):
    """{path in the root: owner} of what a COPY `made` (context.Placed),
    BuildKit's rule: --chown's `owner`, else an archive member's own, else
    what `kept` gives the copied entry (_stage_owners), else root's."""
    found = {}
    for placed in made:
        name = os.path.relpath(placed.path, root)
        if name != ".":
            found[name] = owner or placed.owner and owners.Owner(*placed.owner) or \
                placed.entry and kept(placed.entry) or owners.Owner(0, 0)
    return found


CONFIGURING = {"ENV": _env, "LABEL": _label, "ARG": _arg, "WORKDIR": _workdir, "USER": _user,
               "SHELL": _shell, "CMD": _cmd, "ENTRYPOINT": _entrypoint, "EXPOSE": _expose,
               "VOLUME": _volume, "STOPSIGNAL": _stopsignal,
               "HEALTHCHECK": recorded.healthcheck, "ONBUILD": recorded.onbuild}
CHANGING = {"RUN": _run, "COPY": _copy, "ADD": _copy}


def apply(builder, step, state, *, stage):
    """The State after `step` of stage number `stage`."""
    if step.cmd in CHANGING:
        return CHANGING[step.cmd](builder, step, state, stage=stage)
    new = CONFIGURING[step.cmd](builder, step, state, stage=stage)
    builder.say(step.original)
    return new._replace(key=stepcache.key(state.key, [step.cmd, list(new.config), new.args]))



def triggers(builder, stage, state):
    """The ONBUILD triggers of the image `stage` (plan.Stage) begins from,
    each a step of its own at the FROM line, and `state` without them: the
    image built keeps none (BuildKit's rule)."""
    steps = []
    for text in state.config.onbuild:
        step = parse.trigger(text, stage.where)
        plan.check(step)
        if step.cmd == "ONBUILD" or plan.taken_from(step):
            raise BerthError(f"{stage.where}: the base image's trigger ONBUILD {text}: "
                             "berth build runs no trigger that takes from a stage")
        steps.append(step)
    builder.total += len(steps)
    return steps, state._replace(config=state.config._replace(onbuild=()))
