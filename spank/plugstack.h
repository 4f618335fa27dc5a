/*
 * plugstack.conf: "required /path/spank_berth.so key=value ...", parsed and
 * checked (errors: parse_error.h).
 */
#ifndef BERTH_SPANK_PLUGSTACK_H
#define BERTH_SPANK_PLUGSTACK_H

#include "parse_error.h"

#include <limits.h>
#include <stddef.h>

#define CONTAINER_PREFIX_MAX 32

/* plugstack.conf: required /path/spank_berth.so key=value ... */
struct plugin_conf {
	char runtime_path[PATH_MAX];
	char berth[PATH_MAX];    /* the runtime executable */
	char importer[PATH_MAX]; /* enroot-style "import -o OUT URI"; empty: berth */
	int execute_entrypoint;
	int container_scope_job; /* 0: global (default), 1: job */
	char container_prefix[CONTAINER_PREFIX_MAX + 1]; /* names: <prefix>_<name> */
	int sbatch_support;
	int use_enroot_load;     /* accepted for compatibility, see README */
	int use_squashfuse;      /* accepted for compatibility, see README */
	int cleanup_timeout;     /* seconds a root-run runtime command may take */
};

#define CLEANUP_TIMEOUT_DEFAULT 600
#define CLEANUP_TIMEOUT_MAX 86400

void conf_defaults(struct plugin_conf *conf);
int conf_parse(struct plugin_conf *conf, int argc, char **argv,
	       char *err, size_t errlen);
/* 1/true/yes/y -> 1, 0/false/no/n -> 0, anything else -1 (case-insensitive) */
int parse_bool(const char *value);

#endif
