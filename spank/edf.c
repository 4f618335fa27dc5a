/* See edf.h. Pure string work: no Slurm, no side effects. */
#include "edf.h"
#include "plugstack.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

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
	if (KEY_IS("warning")) /* submit_environment printed it */
		return 0;
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
	if (KEY_IS("device")) { /* a CDI name, which the node's specs resolve */
		if (!is_device_name(value, strlen(value)))
			return fail(err, errlen, "device: '%s' is not a CDI device name", value);
		return append(&edf->devices, '\n', value, strlen(value)) < 0
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
	if (edf.devices && flags->devices) { /* the EDF's devices first, then the flag's */
		if (append(&edf.devices, '\n', flags->devices, strlen(flags->devices)) < 0) {
			flags_free(&edf);
			return fail(err, errlen, "out of memory");
		}
		free(flags->devices);
		flags->devices = NULL;
	}
	take(&flags->devices, &edf.devices);
	if (flags->writable == UNSET)
		flags->writable = edf.writable;
	if (flags->entrypoint == UNSET)
		flags->entrypoint = edf.entrypoint;
	flags_free(&edf);
	return 0;
}
