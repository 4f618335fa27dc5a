/* See keeper.h. */
#define _GNU_SOURCE
#include "keeper.h"
#include "answer.h"
#include "berth_cmd.h"
#include "child.h"
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>

/* How often a keeper not yet ready is looked at, and how long it may be stopped. */
#define KEEPER_POLL_MS 500
#define KEEPER_STOPPED_MS 10000

/*
 * The step's PMIx server dir (PMIX_SERVER_TMPDIR of the tasks). Slurm puts
 * that variable only into each task's env, after the container starts; but
 * its PMIx server, running in this slurmstepd, already maps files below
 * <base>/pmix.<jobid>.<stepid>/, whatever base slurm.conf or mpi.conf chose.
 * 0: found, -1: not a PMIx step.
 */
static int find_pmix_dir(spank_t sp, uint32_t jobid, uint32_t stepid, char *dir)
{
	char component[64], line[PATH_MAX + 256];
	struct stat st;
	FILE *maps;
	int found = -1;

	if (spank_getenv(sp, "PMIX_SERVER_TMPDIR", dir, PATH_MAX) == ESPANK_SUCCESS)
		return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
	snprintf(component, sizeof(component), "/pmix.%u.%u/", jobid, stepid);
	maps = fopen("/proc/self/maps", "re");
	if (maps == NULL)
		return -1;
	while (found < 0 && fgets(line, sizeof(line), maps) != NULL) {
		char *path = strchr(line, '/');
		char *at = path ? strstr(path, component) : NULL;
		size_t len;

		if (at == NULL)
			continue;
		len = (size_t)(at - path) + strlen(component) - 1;
		if (len < PATH_MAX) {
			memcpy(dir, path, len);
			dir[len] = '\0';
			found = stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
		}
	}
	fclose(maps);
	return found;
}

/*
 * slurmstepd execs the batch script from its spool dir (argv[0]) after
 * task_init, by then inside the container: "DIR:DIR" of that dir, or "" for
 * other steps. -1 (logged) when the batch step has no script path.
 */
static int batch_script_mount(spank_t sp, const struct step *st, char *out, size_t outlen)
{
	char **argv = NULL;
	const char *slash;
	int argc = 0, n;

	out[0] = '\0';
	if (st->stepid != SLURM_BATCH_SCRIPT)
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 ||
	    argv[0][0] != '/' || (slash = strrchr(argv[0], '/')) == argv[0]) {
		slurm_error("spank_berth: the batch step has no script path to mount");
		return -1;
	}
	n = snprintf(out, outlen, "%.*s:%.*s", (int)(slash - argv[0]), argv[0],
		     (int)(slash - argv[0]), argv[0]);
	if (n < 0 || (size_t)n >= outlen) {
		slurm_error("spank_berth: the batch script path %s is too long", argv[0]);
		return -1;
	}
	return 0;
}

/*
 * One line of the keeper's stdout into line (len bytes, NUL-terminated,
 * without its newline): its length, or 0 at EOF or a read error. With
 * slow_notice, that is logged if nothing came within a few seconds, so that
 * a long import shows. A keeper stopped (its user's SIGSTOP) for
 * KEEPER_STOPPED_MS while nothing came is given up on: 0, and *stopped set;
 * else this root-owned step would wait on it for ever, and no scancel could
 * end the step (the keeper is outside the step's cgroup).
 */
static size_t read_line(int fd, char *line, size_t len, const char *slow_notice,
			const struct child *keeper, int *stopped)
{
	struct pollfd readable = { fd, POLLIN, 0 };
	int waited_ms = 0, stopped_ms = 0, r;
	size_t used = 0;

	*stopped = 0;
	line[0] = '\0';
	while ((r = poll(&readable, 1, KEEPER_POLL_MS)) <= 0) {
		if (r < 0 && errno != EINTR)
			break;
		if (r < 0)
			continue;
		waited_ms += KEEPER_POLL_MS;
		if (slow_notice != NULL && waited_ms == SLOW_NOTICE_MS)
			slurm_spank_log("spank_berth: %s", slow_notice);
		stopped_ms = child_stopped(keeper) ? stopped_ms + KEEPER_POLL_MS : 0;
		if (stopped_ms >= KEEPER_STOPPED_MS) {
			*stopped = 1;
			return 0;
		}
	}
	while (used < len - 1) {
		ssize_t n = read(fd, line + used, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || line[used] == '\n')
			break;
		used++;
	}
	line[used] = '\0';
	return used;
}

/*
 * "berth start --detach --porcelain ... TARGET" (or "--reuse URI" for an
 * image to import first, whose answer line of digest and cached comes
 * before the pid's): wait for the pid line.
 */
int start_keeper(spank_t sp, struct step *st, const struct plugin_conf *conf,
		 const struct container_flags *flags, const char *target,
		 struct image_request *image, enum keeper_report report)
{
	char log_path[PATH_MAX], pmix_dir[PATH_MAX], pmix_mount[2 * PATH_MAX + 2] = "";
	char script_mount[2 * PATH_MAX + 2];
	struct start_cmd cmd;
	char **env = NULL;
	int in_pipe[2] = { -1, -1 }, out_pipe[2] = { -1, -1 };
	struct answer answer;
	char line[256] = "", err[ERR_LEN];
	size_t used;
	int rc = -1, status, imported, stopped = 0;

	if (start_cmd_begin(&cmd, sp, conf, flags) < 0)
		goto out;
	/* PMIx clients find their server through this dir: same path inside. */
	if (find_pmix_dir(sp, st->jobid, st->stepid, pmix_dir) == 0)
		snprintf(pmix_mount, sizeof(pmix_mount), "%s:%s", pmix_dir, pmix_dir);
	if (batch_script_mount(sp, st, script_mount, sizeof(script_mount)) < 0)
		goto out;
	start_cmd_end(&cmd, (const char *const[]){ pmix_mount, script_mount, NULL },
		      image != NULL ? image->target : target, image != NULL);
	if (path_join(log_path, "%s/start.log", st->step_dir) < 0)
		goto out;
	env = child_env(sp, st, cmd.env, cmd.nenv);
	if (env == NULL)
		goto out;
	if (pipe2(in_pipe, O_CLOEXEC) < 0 || pipe2(out_pipe, O_CLOEXEC) < 0) {
		slurm_error("spank_berth: pipe: %m");
		goto out;
	}
	status = spawn(sp, st, cmd.argv, env,
		       &(struct child_io){ in_pipe[0], out_pipe[1], -1, log_path }, &st->keeper);
	close(in_pipe[0]);
	close(out_pipe[1]);
	in_pipe[0] = out_pipe[1] = -1;
	if (status < 0)
		goto out;
	st->keeper_stdin = in_pipe[1];
	in_pipe[1] = -1;
	answer_init(&answer);
	imported = image == NULL ||
		   (read_line(out_pipe[0], line, sizeof(line), image->notice, &st->keeper,
			      &stopped) > 0 &&
		    answer_parse(line, &answer, err, sizeof(err)) == 0 &&
		    ANSWER_HAS(&answer, digest));
	if (image != NULL && imported) {
		memcpy(image->digest, answer.digest, sizeof(answer.digest));
		image->cached = answer.cached;
	}
	used = imported ? read_line(out_pipe[0], line, sizeof(line), NULL, &st->keeper, &stopped)
			: 0;
	if (used == 0 || answer_parse(line, &answer, err, sizeof(err)) < 0 ||
	    !ANSWER_HAS(&answer, pid)) {
		if (stopped) {
			slurm_error("spank_berth: berth start was stopped (SIGSTOP) for %d s before "
				    "the container was ready; killed", KEEPER_STOPPED_MS / 1000);
			child_signal(&st->keeper, SIGKILL);
			report = KEEPER_QUIET; /* (said already) */
		}
		close(st->keeper_stdin);
		st->keeper_stdin = -1;
		if (child_wait(&st->keeper, -1, "berth start", 0, &status) < 0)
			status = -1;
		/* no digest line: the import failed, in pyxis's words first */
		if (!imported && !stopped)
			report_failure(st, "berth import", log_path, status, image->headline);
		else if (report)
			report_failure(st, "berth start", log_path, status, NULL);
		goto out;
	}
	st->container_pid = answer.pid;
	rc = 0;
out:
	for (int i = 0; i < 2; i++) {
		if (in_pipe[i] >= 0)
			close(in_pipe[i]);
		if (out_pipe[i] >= 0)
			close(out_pipe[i]);
	}
	free(env);
	start_cmd_free(&cmd);
	return rc;
}

/* EOF on its stdin tells the keeper to tear down; signals (by pidfd) if it does not. */
void stop_keeper(struct step *st)
{
	if (st->keeper_stdin >= 0)
		close(st->keeper_stdin);
	st->keeper_stdin = -1;
	if (st->keeper.pidfd < 0)
		return;
	if (!child_exited(&st->keeper, 10000)) {
		slurm_info("spank_berth: container keeper %ld ignored EOF, sending SIGTERM",
			   (long)st->keeper.pid);
		child_signal(&st->keeper, SIGTERM);
		if (!child_exited(&st->keeper, 5000)) {
			child_signal(&st->keeper, SIGKILL);
			child_exited(&st->keeper, 5000);
		}
	}
	child_release(&st->keeper);
}
