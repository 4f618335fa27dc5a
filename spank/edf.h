/*
 * The --environment EDF's values as they travel from the submission side to
 * the nodes (errors: parse_error.h).
 */
#ifndef BERTH_SPANK_EDF_H
#define BERTH_SPANK_EDF_H

#include "container_flags.h"

/*
 * EDF values travel from the submission side to the nodes as one text:
 * "environment=NAME\n" then the lines of "berth edf show --spank NAME"
 * (image=, workdir=, entrypoint=, writable=, mount=, env=, hook_env=).
 * edf_body: the lines after the header if the text is for name, else NULL.
 * apply_edf: those values as defaults under the flags the user gave (flags
 * win; EDF mounts come first), checked like the flags themselves.
 */
const char *edf_body(const char *text, const char *name);
int apply_edf(struct container_flags *flags, const char *lines,
	      int check_files, char *err, size_t errlen);

#endif
