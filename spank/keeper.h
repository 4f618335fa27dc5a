/*
 * The keeper: "berth start --detach", which prints the container's pid and
 * keeps the container until its stdin closes. Started in user_init, stopped
 * at the step's end.
 */
#ifndef BERTH_SPANK_KEEPER_H
#define BERTH_SPANK_KEEPER_H

#include "container_flags.h"
#include "plugstack.h"
#include "step.h"

#include <limits.h>

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/*
 * An image to import, and the lines logged about it. The keeper imports a
 * registry image itself before it starts ("berth start --reuse URI").
 */
struct image_request {
	char uri[PATH_MAX];                /* --container-image as a URI, for messages */
	char pinned[PATH_MAX];             /* the URI resolved at submission, if any */
	const char *target;                /* what is imported: pinned, or uri */
	char notice[PATH_MAX * 2 + 64];    /* logged when the import takes a while */
	char headline[PATH_MAX + 64];      /* logged first when it fails */
	char digest[72];                   /* out: the digest it was pulled by */
	int cached;                        /* out: the image was there before the step */
};

/* Whether start_keeper logs why a start failed (an import's failure it always logs). */
enum keeper_report {
	KEEPER_QUIET,   /* a first try, made again if it fails */
	KEEPER_REPORT,
};

/*
 * Start the keeper of target (a squashfs file or a container name), or of
 * image's target imported first (target NULL), with the step's flags; on
 * success st holds it (keeper, keeper_stdin) and the container's pid, and
 * image->digest is filled in. 0, or -1.
 */
int start_keeper(spank_t sp, struct step *st, const struct plugin_conf *conf,
		 const struct container_flags *flags, const char *target,
		 struct image_request *image, enum keeper_report report);

/* Close the keeper's stdin and wait for it; signal it if it does not go. */
void stop_keeper(struct step *st);

#pragma GCC visibility pop

#endif
