/*
 * Joining tasks (task_init, in each task as the user): the container's
 * environment merged into the task's, its namespaces joined, its root and
 * working directory entered, the runtime's seccomp filter installed.
 */
#ifndef BERTH_SPANK_TASK_H
#define BERTH_SPANK_TASK_H

#include "container_flags.h"
#include "step.h"

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/* Move this task into the container whose pid st holds; 0, or -1 (logged). */
int task_join(spank_t sp, const struct step *st, const struct container_flags *flags);

#pragma GCC visibility pop

#endif
