/*
 * Parsing and validation for spank_berth: plugstack.conf options and
 * --container-* flag values. Nothing here calls Slurm, so the C tests in
 * spank/tests/ exercise it directly.
 *
 * Every function that can fail writes one line into err (naming the key or
 * flag and the bad value) and returns -1; 0 means success.
 */
#ifndef BERTH_SPANK_OPTIONS_H
#define BERTH_SPANK_OPTIONS_H

#include <limits.h>
#include <stddef.h>

#define ERR_LEN 512

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

enum name_mode { NAME_AUTO, NAME_CREATE, NAME_EXEC, NAME_NO_EXEC };
enum tristate { UNSET = -1, OFF = 0, ON = 1 };

/* --container-* values as the user gave them; strings are malloc'ed */
struct container_flags {
	char *image;
	char *mounts;
	char *workdir;
	char *name;             /* without the :mode suffix */
	enum name_mode name_mode;
	char *save;
	char *env_names;        /* --container-env, comma separated */
	char *unshare;          /* comma separated subset of net,ipc,uts */
	enum tristate mount_home;
	enum tristate remap_root;
	enum tristate entrypoint;
	int entrypoint_log;
	enum tristate writable;
	unsigned given;         /* bit (1 << enum switch_id) per switch given */
	char *environment;      /* --environment NAME|PATH.toml as given */
	char *env_set;          /* KEY=VALUE lines of the EDF's env: the container's */
	char *hook_env;         /* KEY=VALUE lines from its annotations: the hooks' */
};

/*
 * The argument-less flags. Each pair (a flag and its opposite) is refused
 * when both are given: set_switch names the two.
 */
enum switch_id {
	SW_MOUNT_HOME, SW_NO_MOUNT_HOME, SW_REMAP_ROOT, SW_NO_REMAP_ROOT,
	SW_ENTRYPOINT, SW_NO_ENTRYPOINT, SW_WRITABLE, SW_READONLY, SW_ENTRYPOINT_LOG,
};
int set_switch(struct container_flags *flags, enum switch_id sw, char *err, size_t errlen);

void flags_init(struct container_flags *flags);
void flags_free(struct container_flags *flags);
/* Did the user ask for a container at all? */
int flags_want_container(const struct container_flags *flags);
/* Cross-flag checks once all flags are parsed (flags without an image...) */
int flags_check(const struct container_flags *flags, char *err, size_t errlen);

/*
 * Value checks, one per flag; they store the value in flags on success.
 * check_files: also look at the local filesystem (submission side).
 */
int set_image(struct container_flags *flags, const char *value,
	      int check_files, char *err, size_t errlen);
int set_mounts(struct container_flags *flags, const char *value,
	       char *err, size_t errlen);
int set_workdir(struct container_flags *flags, const char *value,
		char *err, size_t errlen);
int set_name(struct container_flags *flags, const char *value,
	     char *err, size_t errlen);
int set_save(struct container_flags *flags, const char *value,
	     char *err, size_t errlen);
int set_env_names(struct container_flags *flags, const char *value,
		  char *err, size_t errlen);
int set_unshare(struct container_flags *flags, const char *value,
		char *err, size_t errlen);
int set_environment(struct container_flags *flags, const char *value,
		    char *err, size_t errlen);

/*
 * PYXIS_CONTAINER_* variables: each acts as its flag when the flag was not
 * given (call after the flags, before the EDF). get(name, ctx) returns the
 * variable's value or NULL; an empty value counts as unset. Booleans take
 * parse_bool's words: MOUNT_HOME, REMAP_ROOT, ENTRYPOINT true/false are the
 * flag / its no- form; WRITABLE, READONLY, ENTRYPOINT_LOG true are the flag,
 * false nothing. A bad value is refused naming the variable.
 */
typedef const char *(*env_lookup)(const char *name, void *ctx);
int apply_pyxis_env(struct container_flags *flags, env_lookup get, void *ctx,
		    int check_files, char *err, size_t errlen);

/*
 * --container-mounts entries (also EDF mounts): SRC:DST[:FLAGS], SRC alone
 * (SRC:SRC, absolute), a relative SRC (from the step's working directory,
 * resolved on the node), tmpfs:DST[:OPTIONS], umount:DST. Is the entry of
 * len bytes at spec a tmpfs: or umount: one (no source path to resolve)?
 */
int mount_is_special(const char *spec, size_t len);

/*
 * EDF values travel from the submission side to the nodes as one text:
 * "environment=NAME\n" then the lines of "berth edf show --spank NAME"
 * (image=, workdir=, entrypoint=, writable=, mount=, env=, hook_env=).
 * edf_body: the lines after the header if the text is for name, else NULL.
 * apply_edf: those values as defaults under the flags the user gave (flags
 * win; EDF mounts come first), checked like the flags themselves.
 */
const char *edf_body(const char *text, const char *name);
int apply_edf(struct container_flags *flags, const char *lines,
	      int check_files, char *err, size_t errlen);

/* Is the image a squashfs file rather than a registry reference? */
int image_is_file(const char *image);
/* Length of a docker-archive:, oci-archive: or oci: prefix, else 0. */
size_t image_archive_prefix(const char *image);
/* URI handed to "berth import": docker:// unless a scheme is given */
int image_uri(const char *image, char *out, size_t outlen);
/*
 * A registry image's tag, resolved once per job at submission, reaches the
 * nodes as "URI\nPINNED" (URI as image_uri gives it, PINNED the runtime's
 * docker://...@sha256:... of it). image_pin: PINNED when text is for uri
 * and PINNED is one such line, else NULL.
 */
const char *image_pin(const char *text, const char *uri);
/* Cache file name for a registry image: '/', ':', '#', '@' become '+' */
int image_cache_name(const char *image, char *out, size_t outlen);
/* Is the namespace (net, ipc, uts) in the --container-unshare list? */
int unshare_has(const struct container_flags *flags, const char *ns);
/* Is key one of the comma separated names? */
int name_in_list(const char *list, const char *key, size_t keylen);

/*
 * Environment merge (task env vs the container's), pyxis's rule: the
 * container's value is copied over the task's, except for the variables
 * --container-env names (when the task has them: task_has) and SLURM_*,
 * PMIX_*, PMI_*, which only the task knows. Before that, the task loses
 * LANG, LANGUAGE and LC_ALL unless --container-env names them:
 * task_value_dropped says which.
 */
int container_value_wins(const char *key, size_t keylen, int task_has,
			 const char *env_names);
int task_value_dropped(const char *key, size_t keylen, const char *env_names);

#endif
