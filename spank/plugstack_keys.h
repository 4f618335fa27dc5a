/*
 * The plugstack.conf keys: their one table, one PLUGSTACK_KEY(key, kind,
 * default, min, max) a line. plugstack.h makes struct plugin_conf's fields
 * of it and plugstack.c its parser; roles/spank_plugin checks
 * spank_plugin_options against it (filter_plugins/plugstack_keys.py reads
 * these lines) and the tests hold the docs to it. The default is written as
 * plugstack.conf would give it and parsed like a given value.
 *   path     an absolute path ("" default: none)
 *   bool     1/true/yes/y or 0/false/no/n (any case)
 *   seconds  whole seconds from min to max
 *   name     min to max letters, digits, '_', '.', '-', not starting with '.'
 *   scope    job or global
 * No include guard: each user defines PLUGSTACK_KEY and includes it.
 */
PLUGSTACK_KEY(runtime_path,       path,    "/run/berth",           0, 0)
PLUGSTACK_KEY(berth,              path,    "/usr/local/bin/berth", 0, 0)     /* the runtime */
PLUGSTACK_KEY(importer,           path,    "",                     0, 0)     /* IMPORTER import -o OUT URI */
PLUGSTACK_KEY(execute_entrypoint, bool,    "no",                   0, 0)
PLUGSTACK_KEY(sbatch_support,     bool,    "yes",                  0, 0)
PLUGSTACK_KEY(use_enroot_load,    bool,    "no",                   0, 0)     /* no effect, see README */
PLUGSTACK_KEY(use_squashfuse,     bool,    "no",                   0, 0)     /* no effect, see README */
PLUGSTACK_KEY(cleanup_timeout,    seconds, "600",                  1, 86400) /* a root-run command's */
PLUGSTACK_KEY(container_prefix,   name,    "pyxis",                1, 32)    /* <prefix>_<name> */
PLUGSTACK_KEY(container_scope,    scope,   "global",               0, 0)
