/* See pyxis_env.h. Pure string work: no Slurm, no side effects. */
#include "pyxis_env.h"
#include "plugstack.h"

#include <string.h>

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
		enum switch_id on, off; /* what true and false set; off == on: false means nothing */
	} switches[] = {
		{ "PYXIS_CONTAINER_MOUNT_HOME", SW_MOUNT_HOME, SW_NO_MOUNT_HOME },
		{ "PYXIS_CONTAINER_REMAP_ROOT", SW_REMAP_ROOT, SW_NO_REMAP_ROOT },
		{ "PYXIS_CONTAINER_ENTRYPOINT", SW_ENTRYPOINT, SW_NO_ENTRYPOINT },
		{ "PYXIS_CONTAINER_ENTRYPOINT_LOG", SW_ENTRYPOINT_LOG, SW_ENTRYPOINT_LOG },
		/* false is the other one, so that it beats ENROOT_ROOTFS_WRITABLE too */
		{ "PYXIS_CONTAINER_WRITABLE", SW_WRITABLE, SW_READONLY },
		{ "PYXIS_CONTAINER_READONLY", SW_READONLY, SW_WRITABLE },
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
		int other, b;

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
		other = switch_opposite(sw);
		/* the flag wins: its pair given on the command line */
		if ((given & (1u << sw)) || (other >= 0 && (given & (1u << other))))
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
