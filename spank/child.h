/*
 * Processes the plugin forks, all held by a pidfd (struct child, step.h):
 * the runtime's commands (spawn, their output read by child_read; their
 * command lines are berth_cmd.c's), on the node as the job user and at
 * submission as the submitting user; and on the node the helpers that read
 * or remove the user's files for root.
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
 * group of its own; st NULL: the caller still, ending with it. 0 in the
 * child, 1 in the parent (c filled in), -1 (logged). oom_failed, in the
 * child: oom_score_adj could not be reset.
 */
int fork_user(struct child *c, const struct step *st, const gid_t *groups, int ngroups,
	      int *oom_failed);

/* The job's environment (a login's in the epilog) with KEY=VALUE overrides; free() it. */
char **child_env(spank_t sp, const struct step *st, char **overrides, int noverrides);

/* A spawned child's stdin, stdout and stderr: fds (-1: /dev/null), or stderr into err_path. */
struct child_io {
	int in_fd, out_fd, err_fd;
	const char *err_path; /* opened by the child, as the user; NULL: err_fd */
};

/*
 * Start argv as st's job user with env, in the step dir; st NULL: as the
 * caller (the submission side), where it is, with env (NULL: its own). 0
 * (c holds it) or -1 (logged).
 */
int spawn(spank_t sp, const struct step *st, char *const argv[], char **env,
	  const struct child_io *io, struct child *c);

/* A spawned child's output as child_read collects it. */
struct child_output {
	int out_fd, err_fd; /* the pipes' read ends (-1: none); child_read leaves them open */
	char *out;          /* stdout, up to outlen - 1 bytes, NUL-terminated */
	size_t outlen, used;
	int overflow;       /* it printed more than that */
	char err[4096];     /* the tail of its stderr (not NUL-terminated) */
	size_t err_used;
};

/*
 * Read o's pipes until both close or deadline (now_ms() time, -1: none)
 * passes; slow_notice: logged when nothing came for SLOW_NOTICE_MS. 0, or
 * -1 (logged) when they cannot be polled.
 */
int child_read(struct child_output *o, long long deadline, const char *slow_notice);

/*
 * The last (up to len - 1) bytes of a regular file below the user's tree,
 * NUL-terminated, read as the user; "" when there is none.
 */
void read_user_tail(const struct step *st, const char *path, char *buf, size_t len);

#pragma GCC visibility pop

#endif
