/* See submit.h. */
#define _GNU_SOURCE
#include "submit.h"
#include "berth_cmd.h"
#include "edf.h"
#include "image_ref.h"
#include "pyxis_env.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Resolve --environment through the runtime and put the result into this
 * process's environment, which srun/sbatch/salloc hand to the job. A job
 * step inside an sbatch/salloc of the same environment finds it there
 * already: resolved once, at the first submission.
 */
/* The runtime's warning=LINE lines (an annotation for a hook this cluster
 * lacks, say): once, at the first submission, and the job goes on. */
static void print_edf_warnings(const char *lines)
{
	static const char key[] = "warning=";

	for (const char *p = lines; *p != '\0'; ) {
		size_t len = strcspn(p, "\n");

		if (strncmp(p, key, sizeof(key) - 1) == 0)
			slurm_spank_log("spank_berth: warning: --environment: %.*s",
					(int)(len - (sizeof(key) - 1)), p + sizeof(key) - 1);
		p += len + (p[len] == '\n');
	}
}

int submit_environment(const struct plugin_conf *conf, struct container_flags *flags)
{
	const char *inherited = getenv(EDF_VAR);
	char msg[ERR_LEN], err[ERR_LEN];
	char *text = NULL;
	int header, rc = -1;

	if (inherited != NULL && edf_body(inherited, flags->environment) != NULL) {
		if (apply_edf(flags, edf_body(inherited, flags->environment), 1,
			      err, sizeof(err)) < 0) {
			slurm_error("spank_berth: %s", err);
			return -1;
		}
		return 0;
	}
	text = malloc(EDF_MAX);
	if (text == NULL) {
		slurm_error("spank_berth: out of memory");
		return -1;
	}
	header = snprintf(text, EDF_MAX, "environment=%s\n", flags->environment);
	if (header < 0 || header >= EDF_MAX / 2) {
		slurm_error("spank_berth: --environment: the name is too long");
		goto out;
	}
	if (berth_edf_show(conf, flags->environment, text + header, EDF_MAX - (size_t)header, msg,
			   sizeof(msg)) < 0) {
		slurm_error("spank_berth: --environment: %s", msg);
		goto out;
	}
	if (apply_edf(flags, text + header, 1, err, sizeof(err)) < 0) {
		slurm_error("spank_berth: %s", err);
		goto out;
	}
	print_edf_warnings(text + header);
	if (setenv(EDF_VAR, text, 1) < 0) {
		slurm_error("spank_berth: --environment: cannot set %s: %m", EDF_VAR);
		goto out;
	}
	rc = 0;
out:
	free(text);
	return rc;
}

/*
 * A SIF --container-image checked here, as the step would check it ("berth
 * --quiet import PATH.sif"): a broken, encrypted or foreign-architecture
 * file is refused before anything is submitted, in the runtime's words.
 */
int submit_check_image(const struct plugin_conf *conf, const struct container_flags *flags)
{
	char msg[ERR_LEN];

	if (flags->image == NULL || !image_is_sif(flags->image))
		return 0;
	if (berth_check_sif(conf, flags->image, msg, sizeof(msg)) < 0) {
		slurm_error("spank_berth: --container-image: %s", msg);
		return -1;
	}
	return 0;
}

/*
 * Resolve a registry --container-image to the digest its tag names now
 * ("berth import --resolve URI": one manifest request, as the user) and put
 * "URI\nPINNED" into this process's environment, which srun/sbatch/salloc
 * hand to the job. A step inside an sbatch/salloc of the same image finds
 * it there already: resolved once per job. A failure that asking again
 * will not mend (the runtime's BERTH_STATUS_PERMANENT: no such host, no
 * such image, access refused) refuses the job in the runtime's one line,
 * as a bad flag is. Any other is left to the nodes, which import the tag
 * as they find it (and retry what may pass), as without this; one line
 * says so. Started here, collected by submit_image_finish: srun collects
 * it after its allocation is granted, so that the request and the
 * allocation overlap.
 */
int submit_image_start(const struct plugin_conf *conf, const struct container_flags *flags,
		       struct image_resolve *resolve)
{
	const char *inherited = getenv(IMAGE_VAR);
	char msg[ERR_LEN];

	if (submit_image_finish(conf, resolve) < 0) /* one still pending: collected first */
		return -1;
	/* files and archives have no tag; a plugstack importer= imports by name */
	if (flags->image == NULL || conf->importer[0] != '\0' || image_is_file(flags->image) ||
	    image_archive_prefix(flags->image) > 0 ||
	    image_uri(flags->image, resolve->uri, sizeof(resolve->uri)) < 0 ||
	    image_registry_scheme(resolve->uri) == 0)
		return 0;
	if (inherited != NULL && image_pin(inherited, resolve->uri) != NULL)
		return 0;
	/* named by its digest already: the nodes import that, with nothing to ask */
	if (strstr(resolve->uri, "@sha256:") != NULL)
		return 0;
	if (berth_resolve_start(conf, resolve->uri, &resolve->child, msg, sizeof(msg)) < 0)
		slurm_spank_log("spank_berth: warning: cannot resolve %s to a digest here (%s); "
				"each node imports the tag as it finds it then", resolve->uri, msg);
	return 0;
}

int submit_image_finish(const struct plugin_conf *conf, struct image_resolve *resolve)
{
	char pinned[PATH_MAX], msg[ERR_LEN];
	const char *uri = resolve->uri;
	char *text = NULL;
	int permanent;
	size_t len;

	if (resolve->child.child.pidfd < 0)
		return 0;
	if (berth_resolve_finish(conf, &resolve->child, pinned, sizeof(pinned), msg,
				 sizeof(msg), &permanent) < 0) {
		if (permanent) {
			slurm_error("spank_berth: --container-image: %s", msg);
			return -1;
		}
		slurm_spank_log("spank_berth: warning: cannot resolve %s to a digest here (%s); "
				"each node imports the tag as it finds it then", uri, msg);
		return 0;
	}
	len = strlen(pinned);
	if (len > 0 && pinned[len - 1] == '\n')
		pinned[--len] = '\0';
	text = malloc(strlen(uri) + len + 2);
	if (text == NULL) {
		slurm_error("spank_berth: out of memory");
		return 0;
	}
	snprintf(text, strlen(uri) + len + 2, "%s\n%s", uri, pinned);
	if (image_pin(text, uri) == NULL)
		slurm_spank_log("spank_berth: warning: %s import --resolve %s printed no pinned "
				"URI; each node imports the tag as it finds it then", conf->berth, uri);
	else if (setenv(IMAGE_VAR, text, 1) < 0)
		slurm_spank_log("spank_berth: warning: cannot set %s: %m", IMAGE_VAR);
	free(text);
	return 0;
}

void submit_image_cancel(struct image_resolve *resolve)
{
	berth_resolve_cancel(&resolve->child);
}

/* PYXIS_CONTAINER_* lookups: the submitting process's environment, or the job's. */
static const char *local_env(const char *name, void *ctx)
{
	(void)ctx;
	return getenv(name);
}

static const char *job_env(const char *name, void *ctx)
{
	static char value[PATH_MAX * 4];

	if (spank_getenv((spank_t)ctx, name, value, sizeof(value)) != ESPANK_SUCCESS)
		return NULL;
	return value;
}

int pyxis_env(spank_t sp, int remote, struct container_flags *flags)
{
	char err[ERR_LEN];

	if (apply_pyxis_env(flags, remote ? job_env : local_env, sp, !remote,
			    err, sizeof(err)) < 0) {
		slurm_error("spank_berth: %s", err);
		return -1;
	}
	return 0;
}
