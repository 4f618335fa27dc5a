/*
 * The submission side (srun, sbatch, salloc: local and allocator contexts)
 * and what it hands the nodes: PYXIS_CONTAINER_* variables, the
 * --environment EDF and a registry image's digest, each resolved once at
 * submission and read back on the node (container.c).
 */
#ifndef BERTH_SPANK_SUBMIT_H
#define BERTH_SPANK_SUBMIT_H

#include "berth_cmd.h"
#include "container_flags.h"
#include "plugstack.h"

#include <sys/types.h>

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/*
 * The EDF is resolved once, at submission (the submitting environment
 * expands its ${VAR}s), and its values reach the nodes in the job's
 * environment under this name: see edf_body() in edf.h. SLURM_* names
 * survive sbatch --export=NONE, so a containerized batch step finds it too.
 */
#define EDF_VAR "SLURM_BERTH_EDF"
#define EDF_MAX 65536

/*
 * A registry image's tag, resolved to its digest once at submission, the
 * same way: "URI\nPINNED" (image_pin() in image_ref.h). Every node of the
 * job imports PINNED, so a tag that moves meanwhile changes nothing, and
 * the next job sees where it points then.
 */
#define IMAGE_VAR "SLURM_BERTH_IMAGE"

/*
 * PYXIS_CONTAINER_* into flags, from the submitting process's environment
 * or (remote) the job's. -1 (logged) on a bad value.
 */
int pyxis_env(spank_t sp, int remote, struct container_flags *flags);

/*
 * Resolve --environment through the runtime (conf->berth) into flags and
 * into this process's environment, which srun/sbatch/salloc hand to the job.
 */
int submit_environment(const struct plugin_conf *conf, struct container_flags *flags);

/*
 * A SIF --container-image checked through the runtime before submission:
 * -1 (logged, in the runtime's words) when a step would refuse it.
 */
int submit_check_image(const struct plugin_conf *conf, const struct container_flags *flags);

/* A registry image's tag being resolved to a digest (uri: the image's URI). */
struct image_resolve {
	struct capture child;
	char uri[PATH_MAX];
};
#define IMAGE_RESOLVE_INIT { { { 0, -1 }, -1, -1 }, "" }

/*
 * A registry image's tag resolved to a digest through the runtime, once
 * per job, into this process's environment for the job. start begins it
 * when there is a tag to resolve; finish waits for it and sets the
 * environment; cancel kills one that will not be collected. Each returns
 * -1 (logged in the runtime's line) where the job is to be refused: a
 * failure asking again will not mend. Any other failure is a warning, and
 * the job goes on to the nodes (0).
 */
int submit_image_start(const struct plugin_conf *conf, const struct container_flags *flags,
		       struct image_resolve *resolve);
int submit_image_finish(const struct plugin_conf *conf, struct image_resolve *resolve);
void submit_image_cancel(struct image_resolve *resolve);

#pragma GCC visibility pop

#endif
