/*
 * Every command line of the runtime that the plugin runs ("berth ..." and a
 * plugstack importer's "import -o"), and the reading of its errors: its last
 * stderr line, without its "berth: error: ". On the node a command runs as
 * the job user (spawn), its stderr in the step dir's <verb>.log; on the
 * submission side as the submitting user, its output captured.
 */
#ifndef BERTH_SPANK_BERTH_CMD_H
#define BERTH_SPANK_BERTH_CMD_H

#include "child.h"
#include "container_flags.h"
#include "plugstack.h"
#include "step.h"

#include <stddef.h>
#include <sys/types.h>

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/*
 * On the node, each run to completion as the job user: 0, or -1 (logged).
 * headline: logged first on failure; notice: logged when it is slow to
 * print (an import).
 */
/* "berth import --cache-only --porcelain [--reuse] URI": out gets its answer line (answer.h). */
int berth_import(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *uri, int reuse, char *out, size_t outlen, const char *notice,
		 const char *headline);
/* "IMPORTER import -o OUT URI" (plugstack importer=). */
int importer_import(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		    const char *out_path, const char *uri, const char *headline);
/* "berth list": one container name a line into out. */
int berth_list(spank_t sp, const struct step *st, const struct plugin_conf *conf,
	       char *out, size_t outlen);
int berth_create(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *name, const char *sqsh);
int berth_export(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *save, const char *name);
int berth_remove(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *name);

/*
 * "berth start --detach --porcelain ..." (the keeper, which keeper.c
 * spawns; its answer lines: answer.h): argv, and
 * env, the variables set over the job's environment for it (ENROOT_* from
 * the flags, the EDF's hook annotations). start_cmd_begin: the flags' part
 * (0, or -1 logged); start_cmd_end: more mounts ("" for none; NULL ends
 * them), then the target, a squashfs, a container or (reuse) a URI to
 * import first. start_cmd_free after either.
 */
struct start_cmd {
	char **argv;
	int argc;
	char **env;
	int nenv;
	char *mounts, *env_set, *hook_env, *devices; /* copies of the flags' lists, cut up */
	char **mount_args;                 /* the -m arguments made from them */
	size_t nmount_args;
	char home[64], remap[64], writable[64];
};
int start_cmd_begin(struct start_cmd *cmd, spank_t sp, const struct plugin_conf *conf,
		    const struct container_flags *flags);
void start_cmd_end(struct start_cmd *cmd, const char *const mounts[], const char *target,
		   int reuse);
void start_cmd_free(struct start_cmd *cmd);

/* Log why a runtime command failed (headline first), from its log's last line. */
void report_failure(const struct step *st, const char *what, const char *log_path, int status,
		    const char *headline);

/* On the submission side: a runtime command started, its output not yet read. */
struct capture {
	struct child child; /* pidfd -1: none */
	int out_fd, err_fd;
};

/*
 * "berth edf show --spank NAME", run to completion: its lines into out, or
 * -1 and why in msg.
 */
int berth_edf_show(const struct plugin_conf *conf, const char *name, char *out, size_t outlen,
		   char *msg, size_t msglen);
/*
 * "berth --quiet import PATH.sif": the SIF file checked as a step would
 * check it, at submission; on failure its one line in msg.
 */
int berth_check_sif(const struct plugin_conf *conf, const char *path, char *msg, size_t msglen);

/*
 * "berth import --resolve URI": start starts it (-1 and why in msg),
 * finish collects its output into out (-1 and why in msg; *permanent
 * set where the runtime ended with BERTH_STATUS_PERMANENT, answer_status.h:
 * asking again, on the nodes, would fail the same), cancel kills one that
 * will not be collected.
 */
int berth_resolve_start(const struct plugin_conf *conf, const char *uri, struct capture *c,
			char *msg, size_t msglen);
int berth_resolve_finish(const struct plugin_conf *conf, struct capture *c, char *out,
			 size_t outlen, char *msg, size_t msglen, int *permanent);
void berth_resolve_cancel(struct capture *c);

#pragma GCC visibility pop

#endif
