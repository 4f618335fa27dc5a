/* See options.h. Pure string work plus stat(2): no Slurm, no side effects. */
#include "options.h"

#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int copy_str(char *dst, size_t dstlen, const char *src)
{
	size_t n = strlen(src);

	if (n >= dstlen)
		return -1;
	memcpy(dst, src, n + 1);
	return 0;
}

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

void conf_defaults(struct plugin_conf *conf)
{
	memset(conf, 0, sizeof(*conf));
	strcpy(conf->runtime_path, "/run/berth");
	strcpy(conf->berth, "/usr/local/bin/berth");
	strcpy(conf->container_prefix, "pyxis");
	conf->sbatch_support = 1;
	conf->cleanup_timeout = CLEANUP_TIMEOUT_DEFAULT;
}

int parse_bool(const char *value)
{
	static const char *const yes[] = { "1", "true", "yes", "y" };
	static const char *const no[] = { "0", "false", "no", "n" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(value, yes[i]) == 0)
			return 1;
		if (strcasecmp(value, no[i]) == 0)
			return 0;
	}
	return -1;
}

static int conf_path(char *dst, const char *key, const char *value,
		     char *err, size_t errlen)
{
	if (value[0] != '/')
		return fail(err, errlen, "%s: '%s' is not an absolute path",
			    key, value);
	if (copy_str(dst, PATH_MAX, value) < 0)
		return fail(err, errlen, "%s: path too long", key);
	return 0;
}

static int conf_bool(int *dst, const char *key, const char *value,
		     char *err, size_t errlen)
{
	int b = parse_bool(value);

	if (b < 0)
		return fail(err, errlen,
			    "%s: '%s' is not a boolean (1/true/yes/y or 0/false/no/n)",
			    key, value);
	*dst = b;
	return 0;
}

/* whole seconds, 1..CLEANUP_TIMEOUT_MAX, digits only */
static int conf_seconds(int *dst, const char *key, const char *value,
			char *err, size_t errlen)
{
	long seconds = 0;

	if (value[0] == '\0' || strspn(value, "0123456789") != strlen(value) ||
	    strlen(value) > 6)
		return fail(err, errlen, "%s: '%s' is not a number of seconds", key, value);
	seconds = strtol(value, NULL, 10);
	if (seconds < 1 || seconds > CLEANUP_TIMEOUT_MAX)
		return fail(err, errlen, "%s: %ld is not between 1 and %d seconds",
			    key, seconds, CLEANUP_TIMEOUT_MAX);
	*dst = (int)seconds;
	return 0;
}

/* A site's prefix for container names: letters, digits, '_', '.', '-'. */
static int conf_prefix(char *dst, const char *key, const char *value,
		       char *err, size_t errlen)
{
	size_t n = strlen(value);

	if (n == 0 || n > CONTAINER_PREFIX_MAX || value[0] == '.' ||
	    strspn(value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != n)
		return fail(err, errlen, "%s: '%s' is not 1 to %d letters, digits, '_', '.' or '-' "
			    "(not starting with '.')", key, value, CONTAINER_PREFIX_MAX);
	memcpy(dst, value, n + 1);
	return 0;
}

int conf_parse(struct plugin_conf *conf, int argc, char **argv,
	       char *err, size_t errlen)
{
	conf_defaults(conf);
	for (int i = 0; i < argc; i++) {
		const char *arg = argv[i];
		const char *eq = strchr(arg, '=');
		char key[64];
		const char *value;
		size_t keylen;
		int rc;

		if (eq == NULL)
			return fail(err, errlen, "plugstack option '%s' is not key=value", arg);
		keylen = (size_t)(eq - arg);
		if (keylen == 0 || keylen >= sizeof(key))
			return fail(err, errlen, "plugstack option '%s' has a bad key", arg);
		memcpy(key, arg, keylen);
		key[keylen] = '\0';
		value = eq + 1;

		if (strcmp(key, "runtime_path") == 0)
			rc = conf_path(conf->runtime_path, key, value, err, errlen);
		else if (strcmp(key, "berth") == 0)
			rc = conf_path(conf->berth, key, value, err, errlen);
		else if (strcmp(key, "importer") == 0)
			rc = conf_path(conf->importer, key, value, err, errlen);
		else if (strcmp(key, "execute_entrypoint") == 0)
			rc = conf_bool(&conf->execute_entrypoint, key, value, err, errlen);
		else if (strcmp(key, "sbatch_support") == 0)
			rc = conf_bool(&conf->sbatch_support, key, value, err, errlen);
		else if (strcmp(key, "use_enroot_load") == 0)
			rc = conf_bool(&conf->use_enroot_load, key, value, err, errlen);
		else if (strcmp(key, "use_squashfuse") == 0)
			rc = conf_bool(&conf->use_squashfuse, key, value, err, errlen);
		else if (strcmp(key, "container_prefix") == 0)
			rc = conf_prefix(conf->container_prefix, key, value, err, errlen);
		else if (strcmp(key, "cleanup_timeout") == 0)
			rc = conf_seconds(&conf->cleanup_timeout, key, value, err, errlen);
		else if (strcmp(key, "container_scope") == 0) {
			if (strcmp(value, "job") == 0)
				conf->container_scope_job = 1;
			else if (strcmp(value, "global") == 0)
				conf->container_scope_job = 0;
			else
				return fail(err, errlen,
					    "container_scope: '%s' is neither job nor global", value);
			rc = 0;
		} else
			return fail(err, errlen, "unknown plugstack option '%s'", key);
		if (rc < 0)
			return rc;
	}
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
static int opposite(enum switch_id sw)
{
	if (sw == SW_ENTRYPOINT_LOG)
		return -1;
	return (int)sw ^ 1;
}

int set_switch(struct container_flags *flags, enum switch_id sw, char *err, size_t errlen)
{
	int other = opposite(sw);
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
	return 0;
}

int image_is_file(const char *image)
{
	size_t n = strlen(image);

	return image[0] == '/' || image[0] == '.' ||
	       (n > 5 && strcmp(image + n - 5, ".sqsh") == 0);
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

size_t image_archive_prefix(const char *image)
{
	/* the archive forms berth import reads, named as skopeo names them */
	static const char *const prefixes[] = { "docker-archive:", "oci-archive:", "oci:" };

	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (strncmp(image, prefixes[i], strlen(prefixes[i])) == 0)
			return strlen(prefixes[i]);
	return 0;
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
 * or umount:DST. Only what can never work is refused here: where SRC is
 * and what it is, the node says.
 */
static int check_mount(const char *spec, size_t len, char *err, size_t errlen)
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
	if (dst[0] != '/')
		return fail(err, errlen, "--container-mounts: relative destination in '%.*s'",
			    (int)len, spec);
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

const char *edf_body(const char *text, const char *name)
{
	static const char header[] = "environment=";
	size_t n = strlen(name);

	if (strncmp(text, header, sizeof(header) - 1) != 0)
		return NULL;
	text += sizeof(header) - 1;
	if (strncmp(text, name, n) != 0 || text[n] != '\n')
		return NULL;
	return text + n + 1;
}

/* Append item to the sep-separated list *list (malloc'ed). */
static int append(char **list, char sep, const char *item, size_t len)
{
	size_t old = *list ? strlen(*list) : 0;
	char *bigger = realloc(*list, old + len + 2);

	if (bigger == NULL)
		return -1;
	if (old > 0)
		bigger[old++] = sep;
	memcpy(bigger + old, item, len);
	bigger[old + len] = '\0';
	*list = bigger;
	return 0;
}

/* One "key=value" line of the EDF into edf (a scratch flags struct). */
static int edf_line(struct container_flags *edf, const char *line, size_t len,
		    int check_files, char *err, size_t errlen)
{
	const char *eq = memchr(line, '=', len);
	size_t keylen = eq ? (size_t)(eq - line) : len;
	char value[PATH_MAX * 2];
	int b;

	if (eq == NULL || len - keylen - 1 >= sizeof(value))
		return fail(err, errlen, "unexpected line from the runtime: '%.*s'", (int)len, line);
	memcpy(value, eq + 1, len - keylen - 1);
	value[len - keylen - 1] = '\0';
#define KEY_IS(k) (keylen == sizeof(k) - 1 && strncmp(line, k, keylen) == 0)
	if (KEY_IS("image"))
		return set_image(edf, value, check_files, err, errlen);
	if (KEY_IS("workdir"))
		return set_workdir(edf, value, err, errlen);
	if (KEY_IS("mount")) {
		if (strchr(value, ',') != NULL) /* the mount list is comma separated */
			return fail(err, errlen, "mount '%s' has a ','", value);
		if (check_mount(value, strlen(value), err, errlen) < 0)
			return -1;
		return append(&edf->mounts, ',', value, strlen(value)) < 0
			? fail(err, errlen, "out of memory") : 0;
	}
	if (KEY_IS("env") || KEY_IS("hook_env")) {
		if (value[0] == '=' || strchr(value, '=') == NULL)
			return fail(err, errlen, "%.*s: '%s' is not KEY=VALUE", (int)keylen, line, value);
		return append(KEY_IS("env") ? &edf->env_set : &edf->hook_env, '\n',
			      value, strlen(value)) < 0
			? fail(err, errlen, "out of memory") : 0;
	}
	if (KEY_IS("writable") || KEY_IS("entrypoint")) {
		b = parse_bool(value);
		if (b < 0)
			return fail(err, errlen, "%.*s: '%s' is not yes or no", (int)keylen, line, value);
		*(KEY_IS("writable") ? &edf->writable : &edf->entrypoint) = b ? ON : OFF;
		return 0;
	}
#undef KEY_IS
	return fail(err, errlen, "unexpected line from the runtime: '%.*s'", (int)len, line);
}

/* Move *from into *to unless the user set *to already. */
static void take(char **to, char **from)
{
	if (*to == NULL) {
		*to = *from;
		*from = NULL;
	}
}

int apply_edf(struct container_flags *flags, const char *lines,
	      int check_files, char *err, size_t errlen)
{
	struct container_flags edf;
	char inner[ERR_LEN] = "";
	int rc = 0;

	flags_init(&edf);
	for (const char *p = lines; *p != '\0' && rc == 0; ) {
		size_t len = strcspn(p, "\n");

		if (len > 0)
			rc = edf_line(&edf, p, len, check_files, inner, sizeof(inner));
		p += len + (p[len] == '\n');
	}
	if (rc == 0 && edf.mounts && flags->mounts &&
	    append(&edf.mounts, ',', flags->mounts, strlen(flags->mounts)) < 0)
		rc = fail(inner, sizeof(inner), "out of memory");
	if (rc < 0) {
		flags_free(&edf);
		return fail(err, errlen, "--environment: %s: %s", flags->environment, inner);
	}
	take(&flags->image, &edf.image);
	take(&flags->workdir, &edf.workdir);
	if (edf.mounts) { /* EDF mounts first, then the flag's */
		free(flags->mounts);
		flags->mounts = edf.mounts;
		edf.mounts = NULL;
	}
	take(&flags->env_set, &edf.env_set);
	take(&flags->hook_env, &edf.hook_env);
	if (flags->writable == UNSET)
		flags->writable = edf.writable;
	if (flags->entrypoint == UNSET)
		flags->entrypoint = edf.entrypoint;
	flags_free(&edf);
	return 0;
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

int image_uri(const char *image, char *out, size_t outlen)
{
	int n;

	if (strstr(image, "://") != NULL || image_archive_prefix(image) > 0)
		n = snprintf(out, outlen, "%s", image);
	else
		n = snprintf(out, outlen, "docker://%s", image);
	return (n < 0 || (size_t)n >= outlen) ? -1 : 0;
}

const char *image_pin(const char *text, const char *uri)
{
	static const char scheme[] = "docker://";
	size_t n = strlen(uri);
	const char *pin;

	if (n == 0 || strncmp(text, uri, n) != 0 || text[n] != '\n')
		return NULL;
	pin = text + n + 1;
	if (strncmp(pin, scheme, sizeof(scheme) - 1) != 0 || strstr(pin, "@sha256:") == NULL ||
	    strchr(pin, '\n') != NULL)
		return NULL;
	return pin;
}

int image_cache_name(const char *image, char *out, size_t outlen)
{
	const char *scheme = strstr(image, "://");
	size_t i = 0;

	if (scheme != NULL)
		image = scheme + 3;
	for (; *image != '\0'; image++) {
		if (i + 1 >= outlen)
			return -1;
		out[i++] = strchr("/:#@", *image) ? '+' : *image;
	}
	if (i == 0 || i + sizeof(".sqsh") > outlen)
		return -1;
	memcpy(out + i, ".sqsh", sizeof(".sqsh"));
	return 0;
}

/* Variables that describe this job and node: only the task's values are true. */
static int from_slurm(const char *key, size_t keylen)
{
	static const char *const prefixes[] = { "SLURM_", "PMIX_", "PMI_" };

	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
		size_t n = strlen(prefixes[i]);

		if (keylen >= n && strncmp(key, prefixes[i], n) == 0)
			return 1;
	}
	return 0;
}

int container_value_wins(const char *key, size_t keylen, int task_has,
			 const char *env_names)
{
	if (from_slurm(key, keylen))
		return 0;
	return !(task_has && name_in_list(env_names, key, keylen));
}

int task_value_dropped(const char *key, size_t keylen, const char *env_names)
{
	static const char *const locale[] = { "LANG", "LANGUAGE", "LC_ALL" };

	for (size_t i = 0; i < sizeof(locale) / sizeof(locale[0]); i++)
		if (strlen(locale[i]) == keylen && strncmp(key, locale[i], keylen) == 0)
			return !name_in_list(env_names, key, keylen);
	return 0;
}

/* "VAR: rest" from a setter's "--flag: rest" message (inner). */
static int fail_var(char *err, size_t errlen, const char *var, const char *flag,
		    const char *inner)
{
	size_t n = strlen(flag);

	if (strncmp(inner, flag, n) == 0 && strncmp(inner + n, ": ", 2) == 0)
		inner += n + 2;
	return fail(err, errlen, "%s (as %s): %s", var, flag, inner);
}

int apply_pyxis_env(struct container_flags *flags, env_lookup get, void *ctx,
		    int check_files, char *err, size_t errlen)
{
	static const struct {
		const char *var;
		const char *flag;
		int (*set)(struct container_flags *, const char *, char *, size_t);
		size_t field; /* offset of the char * the flag fills */
	} strings[] = {
		{ "PYXIS_CONTAINER_MOUNTS", "--container-mounts", set_mounts,
		  offsetof(struct container_flags, mounts) },
		{ "PYXIS_CONTAINER_WORKDIR", "--container-workdir", set_workdir,
		  offsetof(struct container_flags, workdir) },
		{ "PYXIS_CONTAINER_NAME", "--container-name", set_name,
		  offsetof(struct container_flags, name) },
		{ "PYXIS_CONTAINER_SAVE", "--container-save", set_save,
		  offsetof(struct container_flags, save) },
		{ "PYXIS_CONTAINER_ENV", "--container-env", set_env_names,
		  offsetof(struct container_flags, env_names) },
		{ "PYXIS_CONTAINER_UNSHARE", "--container-unshare", set_unshare,
		  offsetof(struct container_flags, unshare) },
	};
	static const struct {
		const char *var;
		enum switch_id on, off; /* off == on: false means nothing */
	} switches[] = {
		{ "PYXIS_CONTAINER_MOUNT_HOME", SW_MOUNT_HOME, SW_NO_MOUNT_HOME },
		{ "PYXIS_CONTAINER_REMAP_ROOT", SW_REMAP_ROOT, SW_NO_REMAP_ROOT },
		{ "PYXIS_CONTAINER_ENTRYPOINT", SW_ENTRYPOINT, SW_NO_ENTRYPOINT },
		{ "PYXIS_CONTAINER_ENTRYPOINT_LOG", SW_ENTRYPOINT_LOG, SW_ENTRYPOINT_LOG },
		{ "PYXIS_CONTAINER_WRITABLE", SW_WRITABLE, SW_WRITABLE },
		{ "PYXIS_CONTAINER_READONLY", SW_READONLY, SW_READONLY },
	};
	/* the switches of the command line, before any variable sets more */
	unsigned given = flags->given;
	const char *from_env[SW_ENTRYPOINT_LOG + 1] = { NULL };
	char inner[ERR_LEN];
	const char *value;

	value = get("PYXIS_CONTAINER_IMAGE", ctx);
	if (flags->image == NULL && value != NULL && value[0] != '\0' &&
	    set_image(flags, value, check_files, inner, sizeof(inner)) < 0)
		return fail_var(err, errlen, "PYXIS_CONTAINER_IMAGE", "--container-image", inner);
	for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
		char **field = (char **)((char *)flags + strings[i].field);

		value = get(strings[i].var, ctx);
		if (*field != NULL || value == NULL || value[0] == '\0')
			continue;
		if (strings[i].set(flags, value, inner, sizeof(inner)) < 0)
			return fail_var(err, errlen, strings[i].var, strings[i].flag, inner);
	}
	for (size_t i = 0; i < sizeof(switches) / sizeof(switches[0]); i++) {
		enum switch_id on = switches[i].on, off = switches[i].off, sw;
		int other = opposite(on);
		int b;

		value = get(switches[i].var, ctx);
		if (value == NULL || value[0] == '\0')
			continue;
		b = parse_bool(value);
		if (b < 0)
			return fail(err, errlen,
				    "%s: '%s' is not a boolean (1/true/yes/y or 0/false/no/n)",
				    switches[i].var, value);
		sw = b ? on : off;
		if (!b && off == on)
			continue;
		/* the flag wins: its pair given on the command line */
		if ((given & (1u << on)) || (given & (1u << off)) ||
		    (other >= 0 && (given & (1u << other))))
			continue;
		if (other >= 0 && from_env[other] != NULL)
			return fail(err, errlen, "%s and %s were both specified; give one of them",
				    from_env[other], switches[i].var);
		if (set_switch(flags, sw, inner, sizeof(inner)) < 0)
			return fail(err, errlen, "%s: %s", switches[i].var, inner);
		from_env[sw] = switches[i].var;
	}
	return 0;
}
