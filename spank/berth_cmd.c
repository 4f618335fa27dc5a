/*
 * See berth_cmd.h. The runtime's command lines are all written here, so
 * that what the plugin asks of it (docs/architecture/plugin.md, "What
 * happens on a node") reads in one place, as do the ways its failures are
 * told.
 */
#define _GNU_SOURCE
#include "berth_cmd.h"
#include "answer_status.h"
#include "child.h"
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * The last line of text (used bytes) into line; strip: without the
 * runtime's "berth: error: ", where the plugin's own words come first.
 */
static void last_line(const char *text, size_t used, int strip, char *line, size_t linelen)
{
	static const char prefix[] = "berth: error: ";
	const char *end = text + used, *start;

	while (end > text && (end[-1] == '\n' || end[-1] == '\r'))
		end--;
	for (start = end; start > text && start[-1] != '\n'; start--)
		;
	if (strip && (size_t)(end - start) >= sizeof(prefix) - 1 &&
	    strncmp(start, prefix, sizeof(prefix) - 1) == 0)
		start += sizeof(prefix) - 1;
	snprintf(line, linelen, "%.*s", (int)(end - start), start);
}

/*
 * Report why a runtime command failed: headline (if any, a whole line in
 * its own words) first, then its last stderr line ("spank_berth: WHAT: LINE").
 */
void report_failure(const struct step *st, const char *what, const char *log_path, int status,
		    const char *headline)
{
	char buf[4096], line[4096];

	if (strcmp(log_path, "/dev/null") == 0)
		buf[0] = '\0';
	else
		read_user_tail(st, log_path, buf, sizeof(buf));
	last_line(buf, strlen(buf), headline != NULL, line, sizeof(line));
	if (headline != NULL)
		slurm_error("%s", headline);
	if (headline != NULL && *line != '\0')
		slurm_error("spank_berth: %s: %s", what, line);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_NO_USER)
		slurm_error("spank_berth: %s: cannot become uid %u", what, (unsigned)st->uid);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_NO_LOG)
		slurm_error("spank_berth: %s: cannot write %s as uid %u", what, log_path,
			    (unsigned)st->uid);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && line[0] == '\0')
		slurm_error("spank_berth: %s: cannot execute the runtime", what);
	else if (*line != '\0')
		slurm_error("spank_berth: %s failed: %s", what, line);
	else
		slurm_error("spank_berth: %s failed with status %d (log: %s)", what, status, log_path);
}

/*
 * Run a runtime command to completion. out: its stdout (up to outlen - 1
 * bytes, NUL-terminated), or NULL. slow_notice (with out): logged when the
 * command has printed nothing after a few seconds, so a long import shows.
 * As root (task_exit, exit, job_epilog) the wait is bounded by
 * cleanup_timeout: the command runs as the user, who can stall it; and by
 * st->deadline_ms where set.
 * Logs and returns -1 on failure.
 */
static int run_cmd(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		   const char *what, char *const argv[], char *out, size_t outlen,
		   const char *slow_notice, const char *headline)
{
	int timeout_s = geteuid() == 0 ? conf->cleanup_timeout : 0;
	long long deadline = timeout_s > 0 ? now_ms() + 1000LL * timeout_s : -1;
	char log_path[PATH_MAX];
	char **env;
	int pipe_fds[2] = { -1, -1 };
	struct child cmd;
	int status = 0, rc;

	if (st->deadline_ms > 0 && (deadline < 0 || st->deadline_ms < deadline))
		deadline = st->deadline_ms;
	if (st->step_dir[0] == '\0')
		strcpy(log_path, "/dev/null");
	else if (path_join(log_path, "%s/%s.log", st->step_dir, argv[1]) < 0)
		return -1;
	env = child_env(sp, st, NULL, 0);
	if (env == NULL)
		return -1;
	if (out != NULL && pipe2(pipe_fds, O_CLOEXEC) < 0) {
		slurm_error("spank_berth: pipe: %m");
		free(env);
		return -1;
	}
	rc = spawn(sp, st, argv, env, &(struct child_io){ -1, pipe_fds[1], -1, log_path }, &cmd);
	free(env);
	if (out != NULL) {
		struct child_output printed = { .out_fd = pipe_fds[0], .err_fd = -1, .out = out,
						.outlen = outlen };

		close(pipe_fds[1]);
		out[0] = '\0';
		if (rc == 0)
			child_read(&printed, deadline, slow_notice);
		close(pipe_fds[0]);
	}
	if (rc < 0)
		return -1;
	if (child_wait(&cmd, deadline, what, timeout_s, &status) < 0)
		return -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		report_failure(st, what, log_path, status, headline);
		return -1;
	}
	return 0;
}

int berth_import(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *uri, int reuse, char *out, size_t outlen, const char *notice,
		 const char *headline)
{
	char *argv[] = { (char *)conf->berth, "import", "--cache-only", "--porcelain", "--reuse",
			 (char *)uri, NULL };

	if (!reuse) {
		argv[4] = (char *)uri;
		argv[5] = NULL;
	}
	return run_cmd(sp, st, conf, "berth import", argv, out, outlen, notice, headline);
}

int importer_import(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		    const char *out_path, const char *uri, const char *headline)
{
	char *argv[] = { (char *)conf->importer, "import", "-o", (char *)out_path, (char *)uri,
			 NULL };

	return run_cmd(sp, st, conf, "importer", argv, NULL, 0, NULL, headline);
}

int berth_list(spank_t sp, const struct step *st, const struct plugin_conf *conf,
	       char *out, size_t outlen)
{
	char *argv[] = { (char *)conf->berth, "list", NULL };

	return run_cmd(sp, st, conf, "berth list", argv, out, outlen, NULL, NULL);
}

int berth_create(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *name, const char *sqsh)
{
	char *argv[] = { (char *)conf->berth, "create", "-n", (char *)name, (char *)sqsh, NULL };

	return run_cmd(sp, st, conf, "berth create", argv, NULL, 0, NULL, NULL);
}

int berth_export(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *save, const char *name)
{
	char *argv[] = { (char *)conf->berth, "export", "-f", "-o", (char *)save, (char *)name,
			 NULL };

	return run_cmd(sp, st, conf, "berth export", argv, NULL, 0, NULL, NULL);
}

int berth_remove(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		 const char *name)
{
	char *argv[] = { (char *)conf->berth, "remove", "-f", (char *)name, NULL };

	return run_cmd(sp, st, conf, "berth remove", argv, NULL, 0, NULL, NULL);
}

/*
 * One --container-mounts entry as "berth start -m" takes it: a relative
 * source from the step's working directory (as srun's PWD), SRC alone as
 * SRC:SRC; tmpfs: and umount: entries as given. malloc'ed, or NULL (logged).
 */
static char *mount_arg(spank_t sp, const char *entry)
{
	size_t srclen = strcspn(entry, ":");
	const char *rest = entry + srclen; /* "" or ":DST[:FLAGS]" */
	char src[PATH_MAX], path[PATH_MAX];
	char *out = NULL;
	int n;

	if (mount_is_special(entry, strlen(entry)))
		n = asprintf(&out, "%s", entry);
	else if (srclen >= sizeof(src)) {
		slurm_error("spank_berth: --container-mounts: source too long in '%s'", entry);
		return NULL;
	} else {
		memcpy(src, entry, srclen);
		src[srclen] = '\0';
		if (user_path(sp, "--container-mounts", src, path) < 0)
			return NULL;
		n = rest[0] == '\0' ? asprintf(&out, "%s:%s", path, src)
				    : asprintf(&out, "%s%s", path, rest);
	}
	if (n < 0) {
		slurm_error("spank_berth: out of memory");
		return NULL;
	}
	return out;
}

static void set_override(char **env, int *n, char *storage, const char *key, enum tristate value)
{
	if (value == UNSET)
		return;
	sprintf(storage, "%s=%s", key, value == ON ? "yes" : "no");
	env[(*n)++] = storage;
}

int start_cmd_begin(struct start_cmd *cmd, spank_t sp, const struct plugin_conf *conf,
		    const struct container_flags *flags)
{
	size_t nmounts = 1, nenv = 1, nhooks = 1, ndevices = 1;

	memset(cmd, 0, sizeof(*cmd));
	for (const char *p = flags->mounts; p && *p; p++)
		nmounts += *p == ',';
	for (const char *p = flags->env_set; p && *p; p++)
		nenv += *p == '\n';
	for (const char *p = flags->hook_env; p && *p; p++)
		nhooks += *p == '\n';
	for (const char *p = flags->devices; p && *p; p++)
		ndevices += *p == '\n';
	cmd->argv = calloc(2 * nmounts + 2 * nenv + 2 * ndevices + 15, sizeof(*cmd->argv));
	cmd->env = calloc(nhooks + 3, sizeof(*cmd->env));
	cmd->mount_args = calloc(nmounts, sizeof(*cmd->mount_args));
	if (cmd->argv == NULL || cmd->env == NULL || cmd->mount_args == NULL ||
	    (flags->mounts && (cmd->mounts = strdup(flags->mounts)) == NULL) ||
	    (flags->env_set && (cmd->env_set = strdup(flags->env_set)) == NULL) ||
	    (flags->hook_env && (cmd->hook_env = strdup(flags->hook_env)) == NULL) ||
	    (flags->devices && (cmd->devices = strdup(flags->devices)) == NULL)) {
		slurm_error("spank_berth: out of memory");
		return -1;
	}
	set_override(cmd->env, &cmd->nenv, cmd->home, "ENROOT_MOUNT_HOME", flags->mount_home);
	set_override(cmd->env, &cmd->nenv, cmd->remap, "ENROOT_REMAP_ROOT", flags->remap_root);
	set_override(cmd->env, &cmd->nenv, cmd->writable, "ENROOT_ROOTFS_WRITABLE", flags->writable);
	/* hooks run in the caller's environment: the EDF's annotations go there */
	for (char *save = NULL, *e = cmd->hook_env ? strtok_r(cmd->hook_env, "\n", &save) : NULL; e;
	     e = strtok_r(NULL, "\n", &save))
		cmd->env[cmd->nenv++] = e;
	cmd->argv[cmd->argc++] = (char *)conf->berth;
	cmd->argv[cmd->argc++] = "start";
	cmd->argv[cmd->argc++] = "--detach";
	cmd->argv[cmd->argc++] = "--porcelain";
	if (flags->entrypoint != UNSET ? flags->entrypoint == ON : conf->execute_entrypoint)
		cmd->argv[cmd->argc++] = "--entrypoint";
	for (const char *const *ns = (const char *const[]){ "net", "ipc", "uts", NULL }; *ns; ns++)
		if (unshare_has(flags, *ns))
			cmd->argv[cmd->argc++] = strcmp(*ns, "net") == 0 ? "--net" :
						 strcmp(*ns, "ipc") == 0 ? "--ipc" : "--uts";
	for (char *save = NULL, *m = cmd->mounts ? strtok_r(cmd->mounts, ",", &save) : NULL; m;
	     m = strtok_r(NULL, ",", &save)) {
		char *arg = mount_arg(sp, m);

		if (arg == NULL)
			return -1;
		cmd->mount_args[cmd->nmount_args++] = arg;
		cmd->argv[cmd->argc++] = "-m";
		cmd->argv[cmd->argc++] = arg;
	}
	/* --environment's devices: CDI names, resolved by the node's specs */
	for (char *save = NULL, *d = cmd->devices ? strtok_r(cmd->devices, "\n", &save) : NULL; d;
	     d = strtok_r(NULL, "\n", &save)) {
		cmd->argv[cmd->argc++] = "--device";
		cmd->argv[cmd->argc++] = d;
	}
	/* --environment's env: the container's, over its image's */
	for (char *save = NULL, *e = cmd->env_set ? strtok_r(cmd->env_set, "\n", &save) : NULL; e;
	     e = strtok_r(NULL, "\n", &save)) {
		cmd->argv[cmd->argc++] = "-e";
		cmd->argv[cmd->argc++] = e;
	}
	return 0;
}

/* Room for two mounts is kept by start_cmd_begin: the PMIx dir, the batch script's. */
void start_cmd_end(struct start_cmd *cmd, const char *const mounts[], const char *target,
		   int reuse)
{
	for (int i = 0; i < 2 && mounts[i] != NULL; i++) {
		if (mounts[i][0] == '\0')
			continue;
		cmd->argv[cmd->argc++] = "-m";
		cmd->argv[cmd->argc++] = (char *)mounts[i];
	}
	if (reuse)
		cmd->argv[cmd->argc++] = "--reuse";
	cmd->argv[cmd->argc++] = (char *)target;
}

void start_cmd_free(struct start_cmd *cmd)
{
	free(cmd->argv);
	free(cmd->env);
	for (size_t i = 0; i < cmd->nmount_args; i++)
		free(cmd->mount_args[i]);
	free(cmd->mount_args);
	free(cmd->mounts);
	free(cmd->env_set);
	free(cmd->hook_env);
	free(cmd->devices);
	memset(cmd, 0, sizeof(*cmd));
}

/* The submission side: the runtime run as the submitting user, its output captured. */

/*
 * Start argv as the submitting user in its environment (spawn), stdout and
 * stderr into c's pipes (collect with capture_finish). The child ends with
 * this process: a resolve left running by an srun that failed to allocate.
 */
static int capture_start(char *const argv[], struct capture *c, char *msg, size_t msglen)
{
	int out_pipe[2] = { -1, -1 }, err_pipe[2] = { -1, -1 };
	int rc = -1;

	c->out_fd = c->err_fd = -1;
	if (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0)
		snprintf(msg, msglen, "pipe: %s", strerror(errno));
	else if (spawn(NULL, NULL, argv, NULL, &(struct child_io){ -1, out_pipe[1], err_pipe[1], NULL },
		       &c->child) < 0)
		snprintf(msg, msglen, "cannot start %s (see above)", argv[0]);
	else {
		c->out_fd = out_pipe[0];
		c->err_fd = err_pipe[0];
		out_pipe[0] = err_pipe[0] = -1;
		rc = 0;
	}
	for (int i = 0; i < 2; i++) {
		if (out_pipe[i] >= 0)
			close(out_pipe[i]);
		if (err_pipe[i] >= 0)
			close(err_pipe[i]);
	}
	return rc;
}

/* A started capture not to be collected: its child killed and reaped. */
static void capture_cancel(struct capture *c)
{
	int status;

	if (c->child.pidfd < 0)
		return;
	close(c->out_fd);
	close(c->err_fd);
	child_signal(&c->child, SIGKILL);
	child_wait(&c->child, -1, "the runtime", 0, &status);
}

/*
 * Collect a started capture of program: stdout into out (NUL terminated),
 * on failure the last stderr line into msg. 0: exit status 0. *exited:
 * the exit status it ended with, -1 where it did not exit or cannot tell.
 */
static int capture_finish(const char *program, struct capture *c, char *out, size_t outlen,
			  char *msg, size_t msglen, int *exited)
{
	struct child_output o = { .out_fd = c->out_fd, .err_fd = c->err_fd, .out = out,
				  .outlen = outlen };
	int status = 0, rc = -1;

	*exited = -1;
	if (child_read(&o, -1, NULL) < 0) {
		snprintf(msg, msglen, "cannot read what %s printed", program);
		capture_cancel(c);
		return -1;
	}
	close(c->out_fd);
	close(c->err_fd);
	if (child_wait(&c->child, -1, program, 0, &status) < 0) {
		snprintf(msg, msglen, "%s: cannot get its exit status", program);
		return -1;
	}
	if (WIFEXITED(status))
		*exited = WEXITSTATUS(status);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !o.overflow)
		rc = 0;
	else if (o.overflow)
		snprintf(msg, msglen, "%s printed more than %zu bytes", program, outlen - 1);
	else if (o.err_used > 0)
		last_line(o.err, o.err_used, 1, msg, msglen);
	else if (WIFEXITED(status) && WEXITSTATUS(status) >= 126)
		snprintf(msg, msglen, "cannot execute %s", program);
	else
		snprintf(msg, msglen, "%s failed with status %d", program, status);
	return rc;
}

/* Run argv as the submitting user and collect it (see capture_finish). */
static int capture(char *const argv[], char *out, size_t outlen, char *msg, size_t msglen)
{
	struct capture c;
	int exited;

	if (capture_start(argv, &c, msg, msglen) < 0)
		return -1;
	return capture_finish(argv[0], &c, out, outlen, msg, msglen, &exited);
}

int berth_edf_show(const struct plugin_conf *conf, const char *name, char *out, size_t outlen,
		   char *msg, size_t msglen)
{
	char *argv[] = { (char *)conf->berth, "edf", "show", "--spank", (char *)name, NULL };

	return capture(argv, out, outlen, msg, msglen);
}

int berth_check_sif(const struct plugin_conf *conf, const char *path, char *msg, size_t msglen)
{
	char out[256];
	char *argv[] = { (char *)conf->berth, "--quiet", "import", (char *)path, NULL };

	return capture(argv, out, sizeof(out), msg, msglen);
}

int berth_resolve_start(const struct plugin_conf *conf, const char *uri, struct capture *c,
			char *msg, size_t msglen)
{
	char *argv[] = { (char *)conf->berth, "import", "--resolve", (char *)uri, NULL };

	return capture_start(argv, c, msg, msglen);
}

int berth_resolve_finish(const struct plugin_conf *conf, struct capture *c, char *out,
			 size_t outlen, char *msg, size_t msglen, int *permanent)
{
	int exited, rc = capture_finish(conf->berth, c, out, outlen, msg, msglen, &exited);

	*permanent = rc < 0 && exited == BERTH_STATUS_PERMANENT;
	return rc;
}

void berth_resolve_cancel(struct capture *c)
{
	capture_cancel(c);
}
