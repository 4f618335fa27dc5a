/*
 * The end of a step (task_exit after the last local task, or exit when no
 * task started) and of a job (slurmd's epilog, as root): the keeper
 * stopped, the container saved and removed as asked, the user's files gone.
 */
#ifndef BERTH_SPANK_STEPEND_H
#define BERTH_SPANK_STEPEND_H

#include "container_flags.h"
#include "plugstack.h"
#include "step.h"

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/* Stop the container, save and remove what the step asked for, drop the logs; clears st->active. */
int finish_step(spank_t sp, struct step *st, const struct plugin_conf *conf,
		const struct container_flags *flags);

/* container_scope=job: remove the job's named containers (st: filled in from the job);
 * 0 whatever the user did to them, all within cleanup_timeout. */
int epilog_remove(spank_t sp, struct step *st, const struct plugin_conf *conf);

#pragma GCC visibility pop

#endif
