"""HEALTHCHECK and ONBUILD: recorded in the image configuration only, as
BuildKit records them. A health check is Docker's: its test (["NONE"],
["CMD-SHELL", TEXT] or ["CMD", ARG...]) and its flags, durations in
nanoseconds (0: the runtime's default); ONBUILD keeps the text after its
keyword, a trigger a later build runs when it names this image in FROM."""

import re

from berth.errors import BerthError

# --FLAG -> the key of Docker's Healthcheck record
DURATIONS = {"interval": "Interval", "timeout": "Timeout", "start-period": "StartPeriod",
             "start-interval": "StartInterval"}
_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
          "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_MINIMUM = 1_000_000  # 1 ms, BuildKit's least non-zero duration
_NOT_TRIGGERS = ("ONBUILD", "FROM", "MAINTAINER")  # (BuildKit's rule)
_KEYWORD = re.compile(r"\s*onbuild\s+", re.IGNORECASE)


def go_duration(text):
    """Nanoseconds of a Go duration (`1m30s`, `1.5h`, `0`); None when it is none."""
    if text in ("0", "+0", "-0"):
        return 0
    body = text.lstrip("+")
    if body.startswith("-") or not body:
        return None
    total, at = 0.0, 0
    while at < len(body):
        found = _PART.match(body, at)
        if not found or found[1] in ("", "."):
            return None
        total += float(found[1]) * _UNITS[found[2]]
        at = found.end()
    return int(total)


def _duration(flag, where):
    name, _, value = flag[2:].partition("=")
    nanoseconds = go_duration(value) if value else 0
    if nanoseconds is None:
        raise BerthError(f"{where}: HEALTHCHECK --{name}={value}: expected a duration such "
                         "as 30s or 1m30s")
    if 0 < nanoseconds < _MINIMUM:
        raise BerthError(f"{where}: HEALTHCHECK --{name}={value}: less than 1ms")
    return DURATIONS[name], nanoseconds


def _retries(flag, where):
    value = flag.partition("=")[2]
    if not re.fullmatch(r"[0-9]+", value or "0"):
        raise BerthError(f"{where}: HEALTHCHECK {flag}: expected a whole number, not negative")
    return int(value or "0")


def healthcheck(builder, step, state, *, stage):
    kind = step.value[0].upper()
    if kind == "NONE":
        if len(step.value) > 1 or step.flags:
            raise BerthError(f"{step.where}: HEALTHCHECK NONE takes no flags or arguments")
        check = {"Test": ["NONE"]}
    elif kind == "CMD" and len(step.value) > 1:
        test = ["CMD", *step.value[1:]] if step.json else ["CMD-SHELL", " ".join(step.value[1:])]
        check = {"Test": test, **dict.fromkeys(DURATIONS.values(), 0), "Retries": 0}
        for flag in step.flags:
            if flag.startswith("--retries="):
                check["Retries"] = _retries(flag, step.where)
            else:
                key, nanoseconds = _duration(flag, step.where)
                check[key] = nanoseconds
    else:
        raise BerthError(f"{step.where}: expected HEALTHCHECK [FLAGS] CMD COMMAND or "
                         "HEALTHCHECK NONE")
    return state._replace(config=state.config._replace(healthcheck=check))


def trigger_text(step):
    """The trigger an ONBUILD instruction records: its text after ONBUILD."""
    return _KEYWORD.sub("", step.original, count=1)


def check_trigger(step):
    """Refuse the triggers BuildKit refuses."""
    if step.sub_cmd is None or step.sub_cmd.upper() in _NOT_TRIGGERS \
            or not step.sub_cmd.isalpha():
        raise BerthError(f"{step.where}: ONBUILD {step.sub_cmd or ''}: not a trigger "
                         "(ONBUILD takes an instruction but ONBUILD, FROM or MAINTAINER)")


def onbuild(builder, step, state, *, stage):
    onbuilds = (*state.config.onbuild, trigger_text(step))
    return state._replace(config=state.config._replace(onbuild=onbuilds))
