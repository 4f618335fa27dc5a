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
 * The comment above each line says what the key does: scripts/reference.py
 * puts it in docs/reference/plugin.md beside the line's kind and default.
 * No include guard: each user defines PLUGSTACK_KEY and includes it.
 */
/* Per-user state: the plugin makes `<runtime_path>/<uid>/` as root (0700,
 * the user's) and keeps its files in `spank/` below it (pyxis:
 * `/run/pyxis`). */
PLUGSTACK_KEY(runtime_path,       path,    "/run/berth",           0, 0)
/* The runtime the plugin runs (Berth's own key). */
PLUGSTACK_KEY(berth,              path,    "/usr/local/bin/berth", 0, 0)
/* An executable called as `IMPORTER import -o OUT.sqsh URI` instead of
 * `berth import` (enroot's command line fits); none: `berth`. */
PLUGSTACK_KEY(importer,           path,    "",                     0, 0)
/* Run the image's entrypoint when a step gives neither
 * `--container-entrypoint` nor `--no-container-entrypoint` (nor an EDF
 * `entrypoint`). */
PLUGSTACK_KEY(execute_entrypoint, bool,    "no",                   0, 0)
/* Register the flags for `sbatch` and `salloc` too. */
PLUGSTACK_KEY(sbatch_support,     bool,    "yes",                  0, 0)
/* Accepted for pyxis compatibility; no effect: Berth always imports to a
 * squashfs. */
PLUGSTACK_KEY(use_enroot_load,    bool,    "no",                   0, 0)
/* Accepted for pyxis compatibility; no effect: the runtime decides how to
 * mount a squashfs. */
PLUGSTACK_KEY(use_squashfuse,     bool,    "no",                   0, 0)
/* Seconds a runtime command run for a root callback (`berth export` and
 * `berth remove` at step end; the epilog's removals, all together) may take
 * before its process group is killed (Berth's own key). */
PLUGSTACK_KEY(cleanup_timeout,    seconds, "600",                  1, 86400)
/* The first part of the plugin's container names: `<prefix>_<name>`,
 * `<prefix>_<jobid>_<name>`, `<prefix>_<jobid>.<stepid>` (Berth's own key). */
PLUGSTACK_KEY(container_prefix,   name,    "pyxis",                1, 32)
/* `job`: named containers are per job, and the epilog removes the job's;
 * `global`: they are kept across jobs. */
PLUGSTACK_KEY(container_scope,    scope,   "global",               0, 0)
