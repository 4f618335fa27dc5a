/* See env_merge.h. Pure string work: no Slurm, no side effects. */
#include "env_merge.h"
#include "container_flags.h"

#include <string.h>

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
