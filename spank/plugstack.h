/*
 * plugstack.conf: "required /path/spank_berth.so key=value ...", parsed and
 * checked (errors: parse_error.h).
 */
#ifndef BERTH_SPANK_PLUGSTACK_H
#define BERTH_SPANK_PLUGSTACK_H

#include "parse_error.h"

#include <limits.h>
#include <stddef.h>

/* One field per line of plugstack_keys.h, named as its key. */
#define CONF_FIELD_path(key, max)    char key[PATH_MAX];
#define CONF_FIELD_bool(key, max)    int key;
#define CONF_FIELD_seconds(key, max) int key;
#define CONF_FIELD_name(key, max)    char key[(max) + 1];
#define CONF_FIELD_scope(key, max)   int key; /* CONTAINER_SCOPE_* */
struct plugin_conf {
#define PLUGSTACK_KEY(key, kind, def, min, max) CONF_FIELD_##kind(key, max)
#include "plugstack_keys.h"
#undef PLUGSTACK_KEY
};
#undef CONF_FIELD_path
#undef CONF_FIELD_bool
#undef CONF_FIELD_seconds
#undef CONF_FIELD_name
#undef CONF_FIELD_scope

enum { CONTAINER_SCOPE_GLOBAL, CONTAINER_SCOPE_JOB };

/* container_prefix's longest (its max in the table), to size names */
#define CONTAINER_PREFIX_MAX (sizeof(((struct plugin_conf *)0)->container_prefix) - 1)

void conf_defaults(struct plugin_conf *conf);
int conf_parse(struct plugin_conf *conf, int argc, char **argv,
	       char *err, size_t errlen);
/* 1/true/yes/y -> 1, 0/false/no/n -> 0, anything else -1 (case-insensitive) */
int parse_bool(const char *value);

#endif
