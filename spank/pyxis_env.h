/*
 * PYXIS_CONTAINER_* variables: each acts as its flag when the flag was not
 * given (call after the flags, before the EDF). get(name, ctx) returns the
 * variable's value or NULL; an empty value counts as unset. Booleans take
 * parse_bool's words: MOUNT_HOME, REMAP_ROOT, ENTRYPOINT true/false are the
 * flag / its no- form; WRITABLE, READONLY, ENTRYPOINT_LOG true are the flag,
 * false nothing. A bad value is refused naming the variable.
 */
#ifndef BERTH_SPANK_PYXIS_ENV_H
#define BERTH_SPANK_PYXIS_ENV_H

#include "container_flags.h"

typedef const char *(*env_lookup)(const char *name, void *ctx);
int apply_pyxis_env(struct container_flags *flags, env_lookup get, void *ctx,
		    int check_files, char *err, size_t errlen);

#endif
