/* See plugstack.h. Pure string work: no Slurm, no side effects. */
#include "plugstack.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum conf_kind { KIND_path, KIND_bool, KIND_seconds, KIND_name, KIND_scope };

/* plugstack_keys.h, with where each key's field is */
static const struct conf_key {
	const char *name;
	enum conf_kind kind;
	const char *def; /* as plugstack.conf gives it; "": none */
	long min, max;
	size_t offset, size;
} conf_keys[] = {
#define PLUGSTACK_KEY(key, kind, def, min, max) \
	{ #key, KIND_##kind, def, min, max, offsetof(struct plugin_conf, key), \
	  sizeof(((struct plugin_conf *)0)->key) },
#include "plugstack_keys.h"
#undef PLUGSTACK_KEY
};

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

static int conf_path(char *dst, const struct conf_key *k, const char *value,
		     char *err, size_t errlen)
{
	size_t n = strlen(value);

	if (value[0] != '/')
		return fail(err, errlen, "%s: '%s' is not an absolute path",
			    k->name, value);
	if (n >= k->size)
		return fail(err, errlen, "%s: path too long", k->name);
	memcpy(dst, value, n + 1);
	return 0;
}

static int conf_bool(int *dst, const struct conf_key *k, const char *value,
		     char *err, size_t errlen)
{
	int b = parse_bool(value);

	if (b < 0)
		return fail(err, errlen,
			    "%s: '%s' is not a boolean (1/true/yes/y or 0/false/no/n)",
			    k->name, value);
	*dst = b;
	return 0;
}

/* whole seconds, min..max; digits only, at most 6 so strtol cannot overflow */
static int conf_seconds(int *dst, const struct conf_key *k, const char *value,
			char *err, size_t errlen)
{
	long seconds = 0;

	if (value[0] == '\0' || strspn(value, "0123456789") != strlen(value) ||
	    strlen(value) > 6)
		return fail(err, errlen, "%s: '%s' is not a number of seconds", k->name, value);
	seconds = strtol(value, NULL, 10);
	if (seconds < k->min || seconds > k->max)
		return fail(err, errlen, "%s: %ld is not between %ld and %ld seconds",
			    k->name, seconds, k->min, k->max);
	*dst = (int)seconds;
	return 0;
}

/* A site's prefix for container names: letters, digits, '_', '.', '-'. */
static int conf_name(char *dst, const struct conf_key *k, const char *value,
		     char *err, size_t errlen)
{
	size_t n = strlen(value);

	if (n < (size_t)k->min || n > (size_t)k->max || n >= k->size || value[0] == '.' ||
	    strspn(value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != n)
		return fail(err, errlen, "%s: '%s' is not %ld to %ld letters, digits, '_', '.' or '-' "
			    "(not starting with '.')", k->name, value, k->min, k->max);
	memcpy(dst, value, n + 1);
	return 0;
}

static int conf_scope(int *dst, const struct conf_key *k, const char *value,
		      char *err, size_t errlen)
{
	if (strcmp(value, "job") == 0)
		*dst = CONTAINER_SCOPE_JOB;
	else if (strcmp(value, "global") == 0)
		*dst = CONTAINER_SCOPE_GLOBAL;
	else
		return fail(err, errlen, "%s: '%s' is neither job nor global", k->name, value);
	return 0;
}

static int conf_set(struct plugin_conf *conf, const struct conf_key *k, const char *value,
		    char *err, size_t errlen)
{
	char *field = (char *)conf + k->offset;

	switch (k->kind) {
	case KIND_path:
		return conf_path(field, k, value, err, errlen);
	case KIND_bool:
		return conf_bool((int *)field, k, value, err, errlen);
	case KIND_seconds:
		return conf_seconds((int *)field, k, value, err, errlen);
	case KIND_name:
		return conf_name(field, k, value, err, errlen);
	case KIND_scope:
		return conf_scope((int *)field, k, value, err, errlen);
	}
	return fail(err, errlen, "%s: unknown kind of plugstack option", k->name);
}

void conf_defaults(struct plugin_conf *conf)
{
	char err[ERR_LEN];

	memset(conf, 0, sizeof(*conf));
	/* The table's defaults are valid values: make check parses each. */
	for (size_t i = 0; i < sizeof(conf_keys) / sizeof(conf_keys[0]); i++)
		if (conf_keys[i].def[0] != '\0')
			(void)conf_set(conf, &conf_keys[i], conf_keys[i].def, err, sizeof(err));
}

int conf_parse(struct plugin_conf *conf, int argc, char **argv,
	       char *err, size_t errlen)
{
	conf_defaults(conf);
	for (int i = 0; i < argc; i++) {
		const char *arg = argv[i];
		const char *eq = strchr(arg, '=');
		const struct conf_key *k = NULL;
		char key[64];
		size_t keylen;

		if (eq == NULL)
			return fail(err, errlen, "plugstack option '%s' is not key=value", arg);
		keylen = (size_t)(eq - arg);
		if (keylen == 0 || keylen >= sizeof(key))
			return fail(err, errlen, "plugstack option '%s' has a bad key", arg);
		memcpy(key, arg, keylen);
		key[keylen] = '\0';

		for (size_t j = 0; j < sizeof(conf_keys) / sizeof(conf_keys[0]); j++)
			if (strcmp(key, conf_keys[j].name) == 0)
				k = &conf_keys[j];
		if (k == NULL)
			return fail(err, errlen, "unknown plugstack option '%s'", key);
		if (conf_set(conf, k, eq + 1, err, errlen) < 0)
			return -1;
	}
	return 0;
}
