/*
 * The slurmstepd side before the tasks: the step's directories
 * (init_post_opt, as root), then in user_init (as the user) the image
 * import, named containers and their pid files, and the keeper's start.
 */
#ifndef BERTH_SPANK_CONTAINER_H
#define BERTH_SPANK_CONTAINER_H

#include "container_flags.h"
#include "plugstack.h"
#include "step.h"

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/*
 * Fill in st for a step that asked for a container (ids, label, dirs, task
 * count, the EDF resolved at submission) and make runtime_path/<uid>; set
 * st->active unless the step never runs in a container. 0, or -1 (logged).
 */
int step_init(spank_t sp, struct step *st, const struct plugin_conf *conf,
	      struct container_flags *flags);

/* Import, create and start this step's container; -1 (logged) on failure. */
int setup_container(spank_t sp, struct step *st, const struct plugin_conf *conf,
		    const struct container_flags *flags);

/* The pid a named container's pid file holds (read without following a
 * link), or 0. */
long pidfile_pid(const char *pidfile);

/* Does "berth list" name the container? 1, 0, or -1 (logged). */
int container_exists(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		     const char *name);

#pragma GCC visibility pop

#endif
