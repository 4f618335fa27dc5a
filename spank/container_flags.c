/* See container_flags.h. Pure string work plus stat(2): no Slurm, no side effects. */
#include "container_flags.h"
#include "image_ref.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Replace *slot with a copy of value; the old value is freed. */
static int store(char **slot, const char *value, char *err, size_t errlen)
{
	char *copy = strdup(value);

	if (copy == NULL)
		return fail(err, errlen, "out of memory");
	free(*slot);
	*slot = copy;
	return 0;
}

void flags_init(struct container_flags *flags)
{
	memset(flags, 0, sizeof(*flags));
	flags->name_mode = NAME_AUTO;
	flags->mount_home = UNSET;
	flags->remap_root = UNSET;
	flags->entrypoint = UNSET;
	flags->writable = UNSET;
}

void flags_free(struct container_flags *flags)
{
	free(flags->image);
	free(flags->mounts);
	free(flags->workdir);
	free(flags->name);
	free(flags->save);
	free(flags->env_names);
	free(flags->unshare);
	free(flags->environment);
	free(flags->env_set);
	free(flags->hook_env);
	free(flags->devices);
	flags_init(flags);
}

static const char *const switch_names[] = {
	[SW_MOUNT_HOME] = "--container-mount-home",
	[SW_NO_MOUNT_HOME] = "--no-container-mount-home",
	[SW_REMAP_ROOT] = "--container-remap-root",
	[SW_NO_REMAP_ROOT] = "--no-container-remap-root",
	[SW_ENTRYPOINT] = "--container-entrypoint",
	[SW_NO_ENTRYPOINT] = "--no-container-entrypoint",
	[SW_WRITABLE] = "--container-writable",
	[SW_READONLY] = "--container-readonly",
	[SW_ENTRYPOINT_LOG] = "--container-entrypoint-log",
};

/* The other flag of sw's pair, or -1. Pairs are adjacent: (even, odd). */
int switch_opposite(enum switch_id sw)
{
	if (sw == SW_ENTRYPOINT_LOG)
		return -1;
	return (int)sw ^ 1;
}

int set_switch(struct container_flags *flags, enum switch_id sw, char *err, size_t errlen)
{
	int other = switch_opposite(sw);
	enum tristate value = sw % 2 == 0 ? ON : OFF;

	if (other >= 0 && (flags->given & (1u << other)))
		return fail(err, errlen, "%s and %s were both specified; give one of them",
			    switch_names[other], switch_names[sw]);
	flags->given |= 1u << sw;
	switch (sw) {
	case SW_MOUNT_HOME:
	case SW_NO_MOUNT_HOME:
		flags->mount_home = value;
		break;
	case SW_REMAP_ROOT:
	case SW_NO_REMAP_ROOT:
		flags->remap_root = value;
		break;
	case SW_ENTRYPOINT:
	case SW_NO_ENTRYPOINT:
		flags->entrypoint = value;
		break;
	case SW_WRITABLE:
	case SW_READONLY:
		flags->writable = value;
		break;
	case SW_ENTRYPOINT_LOG:
		flags->entrypoint_log = 1;
		break;
	}
	return 0;
}

int flags_want_container(const struct container_flags *flags)
{
	return flags->image != NULL || flags->name != NULL;
}

int flags_check(const struct container_flags *flags, char *err, size_t errlen)
{
	static const char *const need_container =
		"%s needs --container-image or --container-name";

	if (flags_want_container(flags))
		return 0;
	if (flags->environment)
		return fail(err, errlen, "--environment: '%s' sets no image and no "
			    "--container-image is given", flags->environment);
	if (flags->mounts)
		return fail(err, errlen, need_container, "--container-mounts");
	if (flags->workdir)
		return fail(err, errlen, need_container, "--container-workdir");
	if (flags->save)
		return fail(err, errlen, need_container, "--container-save");
	if (flags->env_names)
		return fail(err, errlen, need_container, "--container-env");
	if (flags->unshare)
		return fail(err, errlen, need_container, "--container-unshare");
	if (flags->devices)
		return fail(err, errlen, need_container, "--container-device");
	return 0;
}

/*
 * "#SBATCH --container-image nvcr.io#nvidia/cuda" reaches us as "nvcr.io":
 * the '#' started a comment. A lone registry host has no '/', and its first
 * part has a dot or is localhost; Docker Hub names (ubuntu, python:3) do not.
 */
static int looks_like_bare_registry(const char *image)
{
	const char *at = strchr(image, '@');
	size_t hostlen;

	if (at != NULL) /* USER@HOST */
		image = at + 1;
	hostlen = strcspn(image, ":");
	if (strchr(image, '/') != NULL || strchr(image, '#') != NULL)
		return 0;
	if (hostlen == 9 && strncmp(image, "localhost", 9) == 0)
		return 1;
	return memchr(image, '.', hostlen) != NULL;
}

int set_image(struct container_flags *flags, const char *value,
	      int check_files, char *err, size_t errlen)
{
	struct stat st;
	size_t n = strlen(value);
	size_t archive = image_archive_prefix(value);

	if (n == 0)
		return fail(err, errlen, "--container-image: empty image");
	if (archive > 0) {
		if (value[archive] == '\0' || value[archive] == ':')
			return fail(err, errlen, "--container-image: '%s' names no archive", value);
	} else if (image_is_file(value)) {
		if (check_files && stat(value, &st) < 0)
			return fail(err, errlen, "--container-image: no such file '%s'", value);
		if (check_files && !S_ISREG(st.st_mode))
			return fail(err, errlen, "--container-image: '%s' is not a file", value);
	} else if (strstr(value, "://") == NULL) {
		if (value[n - 1] == '#' || value[n - 1] == ':' || value[n - 1] == '@')
			return fail(err, errlen,
				    "--container-image: '%s' ends without an image name", value);
		if (looks_like_bare_registry(value))
			return fail(err, errlen,
				    "--container-image: '%s' is a registry host without an image "
				    "(in an #SBATCH line '#' starts a comment: write \"REGISTRY#IMAGE\" "
				    "in quotes, or REGISTRY\\#IMAGE)", value);
	}
	return store(&flags->image, value, err, errlen);
}

static int known_mount_flag(const char *flag, size_t len)
{
	/*
	 * enroot's fstab flags that berth start -m takes
	 * (runtime/berth/container/mounts.py; tests/test_spank_plugin.py holds
	 * the two lists equal)
	 */
	static const char *const known[] = {
		"ro", "rw", "bind", "rbind", "defaults",
		"nosuid", "suid", "nodev", "dev", "noexec", "exec",
		"noatime", "atime", "nodiratime", "diratime", "relatime", "norelatime",
		"strictatime", "nostrictatime", "lazytime", "nolazytime",
		"iversion", "noiversion", "mand", "nomand", "sync", "async", "dirsync",
		"nosymfollow", "silent", "loud",
		"private", "rprivate", "shared", "rshared", "slave", "rslave",
		"unbindable", "runbindable",
		"nofail", "x-create=dir", "x-create=file", "x-create=auto", "sqsh",
	};

	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strlen(known[i]) == len && strncmp(flag, known[i], len) == 0)
			return 1;
	return 0;
}

/* spec (len bytes) starts with word and a ':' */
static int has_prefix(const char *spec, size_t len, const char *word)
{
	size_t n = strlen(word);

	return len > n && strncmp(spec, word, n) == 0 && spec[n] == ':';
}

int mount_is_special(const char *spec, size_t len)
{
	return has_prefix(spec, len, "tmpfs") || has_prefix(spec, len, "umount");
}

/* FLAGS of an entry: '+'-joined, each known (or, for tmpfs, an option word). */
static int check_mount_flags(const char *flags, const char *end, int tmpfs,
			     const char *spec, size_t len, char *err, size_t errlen)
{
	if (flags == end)
		return fail(err, errlen, "--container-mounts: empty flags in '%.*s'",
			    (int)len, spec);
	while (flags < end) {
		const char *plus = memchr(flags, '+', (size_t)(end - flags));
		size_t flen = (size_t)((plus ? plus : end) - flags);
		int ok = flen > 0 && known_mount_flag(flags, flen);

		if (tmpfs && flen > 0 && !ok) { /* size=1M, mode=1777, huge=always, ... */
			ok = isalpha((unsigned char)flags[0]);
			for (size_t i = 0; ok && i < flen; i++)
				ok = isalnum((unsigned char)flags[i]) || strchr("_=.%-", flags[i]);
		}
		if (flen == 0)
			return fail(err, errlen, "--container-mounts: empty flag in '%.*s'",
				    (int)len, spec);
		if (!ok)
			return fail(err, errlen, "--container-mounts: unknown %s '%.*s' in '%.*s'",
				    tmpfs ? "tmpfs option" : "flag", (int)flen, flags,
				    (int)len, spec);
		flags += flen + (plus ? 1 : 0);
		if (plus && flags == end)
			return fail(err, errlen, "--container-mounts: empty flag in '%.*s'",
				    (int)len, spec);
	}
	return 0;
}

/*
 * One entry of len bytes at spec: SRC:DST[:FLAGS], SRC, tmpfs:DST[:OPTIONS]
 * or umount:DST. Only what can never work is refused here, and DST as pyxis
 * refuses it: one that starts with neither '/' nor '.'. Where SRC is and
 * what it is, the node says, and where DST leads (a relative one is taken
 * from the container's root, as enroot takes it) too.
 */
int check_mount(const char *spec, size_t len, char *err, size_t errlen)
{
	const char *end = spec + len;
	const char *colon = memchr(spec, ':', len);
	const char *dst, *dst_end;
	int tmpfs = has_prefix(spec, len, "tmpfs");
	int umount = has_prefix(spec, len, "umount");

	if (len == 0)
		return fail(err, errlen, "--container-mounts: empty entry");
	if (colon == spec)
		return fail(err, errlen, "--container-mounts: missing source in '%.*s'",
			    (int)len, spec);
	if (colon == NULL) { /* SRC alone: the same path inside */
		if (spec[0] != '/')
			return fail(err, errlen,
				    "--container-mounts: '%.*s' alone is also the destination: "
				    "it must be an absolute path (or give SRC:DST)", (int)len, spec);
		return 0;
	}
	if (colon + 1 == end)
		return fail(err, errlen, "--container-mounts: missing destination in '%.*s'",
			    (int)len, spec);
	dst = colon + 1;
	dst_end = memchr(dst, ':', (size_t)(end - dst));
	if (dst_end == NULL)
		dst_end = end;
	if (*dst != '/' && *dst != '.') /* pyxis's words, which scripts grep for */
		return fail(err, errlen, "--container-mounts: mount target must be a relative path "
			    "or an absolute path, in '%.*s'", (int)len, spec);
	if (dst_end == end)
		return 0;
	if (umount && !(end - dst_end - 1 == 6 && strncmp(dst_end + 1, "nofail", 6) == 0))
		return fail(err, errlen, "--container-mounts: umount takes no flag but nofail, "
			    "in '%.*s'", (int)len, spec);
	return check_mount_flags(dst_end + 1, end, tmpfs, spec, len, err, errlen);
}

int set_mounts(struct container_flags *flags, const char *value,
	       char *err, size_t errlen)
{
	const char *p = value;

	if (*p == '\0')
		return fail(err, errlen, "--container-mounts: empty value");
	for (;;) {
		size_t len = strcspn(p, ",");

		if (check_mount(p, len, err, errlen) < 0)
			return -1;
		if (p[len] == '\0')
			break;
		p += len + 1;
	}
	return store(&flags->mounts, value, err, errlen);
}

/* A relative workdir is resolved inside the container, from its '/'. */
int set_workdir(struct container_flags *flags, const char *value,
		char *err, size_t errlen)
{
	if (value[0] == '\0')
		return fail(err, errlen, "--container-workdir: empty path");
	return store(&flags->workdir, value, err, errlen);
}

int set_name(struct container_flags *flags, const char *value,
	     char *err, size_t errlen)
{
	static const struct { const char *suffix; enum name_mode mode; } modes[] = {
		{ "auto", NAME_AUTO }, { "create", NAME_CREATE },
		{ "exec", NAME_EXEC }, { "no_exec", NAME_NO_EXEC },
	};
	size_t len = strcspn(value, ":");
	enum name_mode mode = NAME_AUTO;
	char *name;

	if (len == 0)
		return fail(err, errlen, "--container-name: empty name in '%s'", value);
	for (size_t i = 0; i < len; i++)
		if (!isalnum((unsigned char)value[i]) && strchr("_.-", value[i]) == NULL)
			return fail(err, errlen,
				    "--container-name: '%s' may only use letters, digits, '_', '.', '-'",
				    value);
	if (value[0] == '.')
		return fail(err, errlen, "--container-name: '%s' starts with '.'", value);
	if (image_file_name(value, len))
		return fail(err, errlen, "--container-name: '%.*s' ends as an image file's name "
			    "(.sqsh, .sif) does", (int)len, value);
	if (value[len] == ':') {
		const char *suffix = value + len + 1;
		size_t i;

		for (i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
			if (strcmp(suffix, modes[i].suffix) == 0)
				break;
		if (i == sizeof(modes) / sizeof(modes[0]))
			return fail(err, errlen,
				    "--container-name: unknown mode '%s' (create, exec, no_exec, auto)",
				    suffix);
		mode = modes[i].mode;
	}
	name = strndup(value, len);
	if (name == NULL)
		return fail(err, errlen, "out of memory");
	free(flags->name);
	flags->name = name;
	flags->name_mode = mode;
	return 0;
}

int set_save(struct container_flags *flags, const char *value,
	     char *err, size_t errlen)
{
	size_t n = strlen(value);

	if (n == 0)
		return fail(err, errlen, "--container-save: empty path");
	if (value[n - 1] == '/')
		return fail(err, errlen, "--container-save: '%s' is a directory, not a file", value);
	return store(&flags->save, value, err, errlen);
}

int set_env_names(struct container_flags *flags, const char *value,
		  char *err, size_t errlen)
{
	const char *p = value;

	for (;;) {
		size_t len = strcspn(p, ",");

		if (len == 0)
			return fail(err, errlen, "--container-env: empty name in '%s'", value);
		for (size_t i = 0; i < len; i++) {
			unsigned char c = (unsigned char)p[i];

			if (!(isalpha(c) || c == '_' || (i > 0 && isdigit(c))))
				return fail(err, errlen,
					    "--container-env: '%.*s' is not a variable name",
					    (int)len, p);
		}
		if (p[len] == '\0')
			break;
		p += len + 1;
	}
	return store(&flags->env_names, value, err, errlen);
}

/* VENDOR/CLASS=DEVICE, as runtime/berth/container/cdi.py's is_name takes it
 * (its finer rules are the runtime's, on the node) */
int is_device_name(const char *name, size_t len)
{
	const char *eq = memchr(name, '=', len);
	const char *slash = memchr(name, '/', len);

	if (eq == NULL || slash == NULL || slash > eq || slash == name || slash + 1 == eq ||
	    eq + 1 == name + len)
		return 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)name[i];

		if (!(isalnum(c) || strchr("._-:/=", c) != NULL) ||
		    (c == '/' && name + i != slash) || (c == '=' && name + i != eq))
			return 0;
	}
	return 1;
}

int set_devices(struct container_flags *flags, const char *value,
		char *err, size_t errlen)
{
	char *lines = strdup(value);

	if (lines == NULL)
		return fail(err, errlen, "out of memory");
	for (char *p = lines;; ) {
		size_t len = strcspn(p, ",");

		if (!is_device_name(p, len)) {
			size_t at = (size_t)(p - lines);

			free(lines);
			return fail(err, errlen, "--container-device: '%.*s' is not a CDI device "
				    "name (VENDOR/CLASS=NAME, as nvidia.com/gpu=0)", (int)len,
				    value + at);
		}
		if (p[len] == '\0')
			break;
		p[len] = '\n'; /* one a line, as the EDF's */
		p += len + 1;
	}
	free(flags->devices);
	flags->devices = lines;
	return 0;
}

int set_unshare(struct container_flags *flags, const char *value,
		char *err, size_t errlen)
{
	const char *p = value;

	for (;;) {
		size_t len = strcspn(p, ",");

		if (!((len == 3 && (strncmp(p, "net", 3) == 0 ||
				    strncmp(p, "ipc", 3) == 0 ||
				    strncmp(p, "uts", 3) == 0))))
			return fail(err, errlen,
				    "--container-unshare: unknown namespace '%.*s' (net, ipc, uts)",
				    (int)len, p);
		if (p[len] == '\0')
			break;
		p += len + 1;
	}
	return store(&flags->unshare, value, err, errlen);
}

int set_environment(struct container_flags *flags, const char *value,
		    char *err, size_t errlen)
{
	if (value[0] == '\0')
		return fail(err, errlen, "--environment: empty name");
	if (strchr(value, '\n') != NULL)
		return fail(err, errlen, "--environment: the name has a newline");
	return store(&flags->environment, value, err, errlen);
}

int name_in_list(const char *list, const char *key, size_t keylen)
{
	const char *p = list;

	if (list == NULL)
		return 0;
	for (;;) {
		size_t len = strcspn(p, ",");

		if (len == keylen && strncmp(p, key, len) == 0)
			return 1;
		if (p[len] == '\0')
			return 0;
		p += len + 1;
	}
}

int unshare_has(const struct container_flags *flags, const char *ns)
{
	return name_in_list(flags->unshare, ns, strlen(ns));
}
