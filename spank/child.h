/*
 * Processes the plugin forks on the node, all as the job user and held by a
 * pidfd (struct child, step.h): the runtime's commands (spawn; their
 * command lines are berth_cmd.c's), and the helpers that read or remove the
 * user's files for root.
 */
#ifndef BERTH_SPANK_CHILD_H
#define BERTH_SPANK_CHILD_H

#include "step.h"

#include <stddef.h>
#include <sys/types.h>

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/* Exit codes of a child that failed before exec (see report_failure). */
#define EXIT_NO_USER 126
#define EXIT_NO_LOG 125

/* A runtime command that has printed nothing for this long is said to be at work (an import). */
#define SLOW_NOTICE_MS 3000

/* CLOCK_MONOTONIC in milliseconds: the time of the deadlines below. */
long long now_ms(void);
/* Milliseconds until deadline (now_ms() time; -1: none) as a poll timeout. */
int ms_left(long long deadline);

/* Has the child exited within timeout_ms (-1: no limit)? 1: yes, 0: not yet. */
int child_exited(const struct child *c, int timeout_ms);
/* Is the child stopped (SIGSTOP, SIGTSTP) now? */
int child_stopped(const struct child *c);
/* Signal the child through its pidfd. */
void child_signal(const struct child *c, int sig);
/* Reap the child if it has exited and is still ours; forget it. */
void child_release(struct child *c);
/*
 * Wait for the child until deadline (now_ms() time, -1: none); past it, kill
 * its process group and log that what timed out after timeout_s. 0 and its
 * wait status, or -1.
 */
int child_wait(struct child *c, long long deadline, const char *what, int timeout_s,
	       int *status);

/*
 * Fork a child that is st's user (groups: its group list), in a process
 * group of its own. 0 in the child, 1 in the parent (c filled in), -1
 * (logged). oom_failed, in the child: oom_score_adj could not be reset.
 */
int fork_user(struct child *c, const struct step *st, const gid_t *groups, int ngroups,
	      int *oom_failed);

/* The job's environment (a login's in the epilog) with KEY=VALUE overrides; free() it. */
char **child_env(spank_t sp, const struct step *st, char **overrides, int noverrides);

/*
 * Start argv as the job user with env; stdin/stdout in_fd/out_fd (-1:
 * /dev/null), stderr into log_path. 0 (c holds it) or -1 (logged).
 */
int spawn(spank_t sp, const struct step *st, char *const argv[], char **env, int in_fd, int out_fd,
	  const char *log_path, struct child *c);

/*
 * The last (up to len - 1) bytes of a regular file below the user's tree,
 * NUL-terminated, read as the user; "" when there is none.
 */
void read_user_tail(const struct step *st, const char *path, char *buf, size_t len);

#pragma GCC visibility pop

#endif
