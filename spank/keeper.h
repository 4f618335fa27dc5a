/*
 * The keeper: "berth start --detach", which prints the container's pid and
 * keeps the container until its stdin closes. Started in user_init, stopped
 * at the step's end.
 */
#ifndef BERTH_SPANK_KEEPER_H
#define BERTH_SPANK_KEEPER_H

#include "options.h"
#include "step.h"

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/*
 * Start the keeper of target (a squashfs file or a container name) with the
 * step's flags; on success st holds it (keeper, keeper_stdin) and the
 * container's pid. report: log why it failed. 0, or -1.
 */
int start_keeper(spank_t sp, struct step *st, const struct plugin_conf *conf,
		 const struct container_flags *flags, const char *target, int report);

/* Close the keeper's stdin and wait for it; signal it if it does not go. */
void stop_keeper(struct step *st);

#pragma GCC visibility pop

#endif
