/*
 * A site's own SPANK plugin, as molecule/adopt's site runs beside pyxis and
 * then Berth: --site-tag=WORD puts SITE_TAG=WORD in the environment of the
 * step's tasks (in the container, when the step has one). prepare.yml
 * builds it with the node's gcc and Slurm's headers (libslurm-dev).
 */
#include <ctype.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(site_tag, 1);

static char tag[64];

/* One word of letters, digits, '-' and '_': what a tag is here. */
static int on_site_tag(int val, const char *optarg, int remote)
{
	size_t len = optarg == NULL ? 0 : strlen(optarg);

	(void)val;
	(void)remote;
	if (len == 0 || len >= sizeof(tag)) {
		slurm_error("site_tag: --site-tag: one word of 1 to %zu characters", sizeof(tag) - 1);
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		if (!isalnum((unsigned char)optarg[i]) && optarg[i] != '-' && optarg[i] != '_') {
			slurm_error("site_tag: --site-tag=%s: letters, digits, '-' and '_' only", optarg);
			return -1;
		}
	}
	memcpy(tag, optarg, len + 1);
	return 0;
}

struct spank_option spank_options[] = {
	{ "site-tag", "WORD", "[site] export SITE_TAG=WORD to the step's tasks", 1, 0, on_site_tag },
	SPANK_OPTIONS_TABLE_END
};

/* In the step's slurmstepd, before the tasks start: every task gets it. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (tag[0] == '\0')
		return 0;
	if (spank_setenv(sp, "SITE_TAG", tag, 1) != ESPANK_SUCCESS) {
		slurm_error("site_tag: cannot set SITE_TAG");
		return -1;
	}
	return 0;
}
