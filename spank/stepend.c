/* See stepend.h. */
#define _GNU_SOURCE
#include "stepend.h"
#include "berth_cmd.h"
#include "child.h"
#include "container.h"
#include "keeper.h"
#include "paths.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * In a child that is the user (the tree is the user's, and any part of it
 * may be a link the user put there): unlink the named container's pid file
 * we wrote, while it names our keeper, and with_dir, the step dir's files
 * and the dir. Exits 0, or with the errno of what failed.
 */
static void remove_user_files_child(const struct step *st, int with_dir)
{
	char entries[4096] __attribute__((aligned(8)));
	int failed = 0, fd;
	ssize_t n;

	/* (a step that found its container removed and started a new one under
	 * the name wrote its own keeper's pid there) */
	if (st->pidfile[0] != '\0' && pidfile_pid(st->pidfile) == (long)st->container_pid &&
	    unlink(st->pidfile) < 0 && errno != ENOENT)
		failed = errno;
	if (!with_dir)
		_exit(failed);
	fd = open(st->step_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && (errno == ELOOP || errno == ENOTDIR))
		_exit(unlink(st->step_dir) == 0 ? 0 : errno); /* the link, not what it names */
	if (fd < 0)
		_exit(errno == ENOENT ? 0 : errno);
	while ((n = getdents64(fd, entries, sizeof(entries))) > 0) {
		for (ssize_t off = 0; off < n;) {
			struct dirent64 *entry = (struct dirent64 *)(entries + off);

			if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0)
				unlinkat(fd, entry->d_name, 0);
			off += entry->d_reclen;
		}
	}
	close(fd);
	_exit(rmdir(st->step_dir) == 0 ? failed : errno);
}

/* The pid file and (with_dir) the step dir, removed by a child that is the user. */
static void remove_user_files(const struct step *st, const struct plugin_conf *conf,
			      int with_dir)
{
	struct child remover;
	int oom_failed, status = 0;

	if (st->pidfile[0] == '\0' && !with_dir)
		return;
	switch (fork_user(&remover, st, &st->gid, 1, &oom_failed)) {
	case 0:
		remove_user_files_child(st, with_dir);
		_exit(1);
	case -1:
		return;
	}
	if (child_wait(&remover, now_ms() + 1000LL * conf->cleanup_timeout,
		       "removing the step's files as the user", conf->cleanup_timeout, &status) < 0)
		return;
	if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_NO_USER)
		slurm_error("spank_berth: cannot become uid %u to remove %s",
			    (unsigned)st->uid, st->step_dir);
	else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		slurm_info("spank_berth: cannot remove %s%s%s: %s", st->pidfile,
			   st->pidfile[0] && with_dir ? " or " : "", with_dir ? st->step_dir : "",
			   WIFEXITED(status) ? strerror(WEXITSTATUS(status)) : "killed");
}

/* Stop the container, save and remove what the step asked for, drop the logs. */
int finish_step(spank_t sp, struct step *st, const struct plugin_conf *conf,
		const struct container_flags *flags)
{
	int rc = 0;

	stop_keeper(st);
	if (flags->save != NULL && st->container[0] != '\0') {
		char save[PATH_MAX];

		rc = user_path(sp, "--container-save", flags->save, save);
		if (rc == 0)
			rc = berth_export(sp, st, conf, save, st->container);
	}
	if (st->remove_container && berth_remove(sp, st, conf, st->container) < 0)
		rc = -1;
	remove_user_files(st, conf, rc == 0); /* on failure the logs stay for the admin */
	st->active = 0;
	return rc;
}

int epilog_remove(spank_t sp, struct step *st, const struct plugin_conf *conf)
{
	char out[65536], prefix[CONTAINER_PREFIX_MAX + 16], steps[CONTAINER_PREFIX_MAX + 16];
	char *line, *save = NULL;
	int left = 0, failed = 0;

	if (spank_get_item(sp, S_JOB_UID, &st->uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &st->gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &st->jobid) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: epilog: cannot read the job's uid, gid or id");
		return -1;
	}
	/*
	 * What the user did to the job's containers and directories must not
	 * fail the epilog (Slurm drains the node) nor stretch it: every
	 * failure below is logged and the epilog succeeds, and all its
	 * runtime commands together end within cleanup_timeout.
	 */
	st->deadline_ms = now_ms() + 1000LL * conf->cleanup_timeout;
	if (berth_list(sp, st, conf, out, sizeof(out)) < 0) {
		slurm_error("spank_berth: epilog: job %u: its containers could not be listed "
			    "(above); left in place", st->jobid);
		return 0;
	}
	/* NAME, and JOBID.STEPID made by attaching to a step that was gone */
	snprintf(prefix, sizeof(prefix), "%s_%u_", conf->container_prefix, st->jobid);
	snprintf(steps, sizeof(steps), "%s_%u.", conf->container_prefix, st->jobid);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, prefix, strlen(prefix)) != 0 && strncmp(line, steps, strlen(steps)) != 0)
			continue;
		if (now_ms() >= st->deadline_ms)
			left++;
		/* gone meanwhile (the user removed it): nothing left to do */
		else if (berth_remove(sp, st, conf, line) < 0 && container_exists(sp, st, conf, line) != 0)
			failed++;
	}
	if (left > 0)
		slurm_error("spank_berth: epilog: job %u: %d containers left in place: cleanup_timeout "
			    "(%d s) spent", st->jobid, left, conf->cleanup_timeout);
	if (failed > 0)
		slurm_error("spank_berth: epilog: job %u: %d containers could not be removed (above)",
			    st->jobid, failed);
	return 0;
}
