/*
 * Environment merge (task env vs the container's), pyxis's rule: the
 * container's value is copied over the task's, except for the variables
 * --container-env names (when the task has them: task_has) and SLURM_*,
 * PMIX_*, PMI_*, which only the task knows. Before that, the task loses
 * LANG, LANGUAGE and LC_ALL unless --container-env names them:
 * task_value_dropped says which.
 */
#ifndef BERTH_SPANK_ENV_MERGE_H
#define BERTH_SPANK_ENV_MERGE_H

#include <stddef.h>

int container_value_wins(const char *key, size_t keylen, int task_has,
			 const char *env_names);
int task_value_dropped(const char *key, size_t keylen, const char *env_names);

#endif
