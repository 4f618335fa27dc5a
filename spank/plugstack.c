/* See plugstack.h. Pure string work: no Slurm, no side effects. */
#include "plugstack.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int copy_str(char *dst, size_t dstlen, const char *src)
{
	size_t n = strlen(src);

	if (n >= dstlen)
		return -1;
	memcpy(dst, src, n + 1);
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
