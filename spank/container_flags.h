/*
 * The --container-* flags (and --environment) as the user gave them: one
 * check per flag, which stores the value, and the checks across flags
 * (errors: parse_error.h).
 */
#ifndef BERTH_SPANK_CONTAINER_FLAGS_H
#define BERTH_SPANK_CONTAINER_FLAGS_H

#include "parse_error.h"

#include <stddef.h>

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
	char *devices;          /* CDI names of its devices key, one a line */
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
/* --container-device: CDI names, VENDOR/CLASS=NAME, comma separated */
int set_devices(struct container_flags *flags, const char *value,
		char *err, size_t errlen);

/*
 * --container-mounts entries (also EDF mounts): SRC:DST[:FLAGS], SRC alone
 * (SRC:SRC, absolute), a relative SRC (from the step's working directory,
 * resolved on the node), tmpfs:DST[:OPTIONS], umount:DST. Is the entry of
 * len bytes at spec a tmpfs: or umount: one (no source path to resolve)?
 */
int mount_is_special(const char *spec, size_t len);

/* Is the namespace (net, ipc, uts) in the --container-unshare list? */
int unshare_has(const struct container_flags *flags, const char *ns);
/* Is key one of the comma separated names? */
int name_in_list(const char *list, const char *key, size_t keylen);

/*
 * For the other sources of these values (edf.c, pyxis_env.c) only, so kept
 * out of the plugin's exported symbols: the check of one mount entry of len
 * bytes, and the other switch of sw's pair (-1: none).
 */
__attribute__((visibility("hidden")))
int check_mount(const char *spec, size_t len, char *err, size_t errlen);
__attribute__((visibility("hidden")))
int switch_opposite(enum switch_id sw);
/* Is the len bytes at name a CDI device name (VENDOR/CLASS=DEVICE)? */
__attribute__((visibility("hidden")))
int is_device_name(const char *name, size_t len);

#endif
