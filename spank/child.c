/*
 * See child.h. Every process the plugin forks is held by a pidfd, and on
 * the node is the job user's (fork_user); the runtime is started one way
 * only (spawn), on the node and at submission alike, and its output read
 * one way (child_read).
 */
#define _GNU_SOURCE
#include "child.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3 /* waitid on a pidfd, Linux 5.4 */
#endif

/* A login's environment for the job user, where Slurm has no job env (epilog). */
static char **login_env(const struct step *st)
{
	static char home[PATH_MAX + 8], user[64], logname[64];
	static char path[] = "PATH=/usr/local/bin:/usr/bin:/bin";
	static char *env[] = { home, user, logname, path, NULL };
	char buf[4096];
	struct passwd pw, *found = NULL;

	if (getpwuid_r(st->uid, &pw, buf, sizeof(buf), &found) != 0 || found == NULL) {
		slurm_error("spank_berth: no passwd entry for uid %u", (unsigned)st->uid);
		return NULL;
	}
	snprintf(home, sizeof(home), "HOME=%s", pw.pw_dir);
	snprintf(user, sizeof(user), "USER=%s", pw.pw_name);
	snprintf(logname, sizeof(logname), "LOGNAME=%s", pw.pw_name);
	return env;
}

/* NULL-terminated copy of the job env with KEY=VALUE overrides replacing their keys. */
char **child_env(spank_t sp, const struct step *st, char **overrides, int noverrides)
{
	char **job_env = NULL;
	char **env;
	int n = 0, out = 0;

	if (spank_get_item(sp, S_JOB_ENV, &job_env) != ESPANK_SUCCESS || job_env == NULL)
		job_env = login_env(st);
	if (job_env == NULL)
		return NULL;
	while (job_env[n] != NULL)
		n++;
	env = calloc((size_t)(n + noverrides + 1), sizeof(*env));
	if (env == NULL) {
		slurm_error("spank_berth: out of memory");
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		int replaced = 0;

		for (int j = 0; j < noverrides; j++) {
			size_t keylen = strcspn(overrides[j], "=") + 1;

			if (strncmp(job_env[i], overrides[j], keylen) == 0)
				replaced = 1;
		}
		if (!replaced)
			env[out++] = job_env[i];
	}
	for (int j = 0; j < noverrides; j++)
		env[out++] = overrides[j];
	return env;
}

/* How long root waits for a child that only reads a log for it. */
#define READ_TIMEOUT_MS 10000

long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds until deadline (now_ms() time; -1: none) as a poll timeout. */
int ms_left(long long deadline)
{
	long long left;

	if (deadline < 0)
		return -1;
	left = deadline - now_ms();
	return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

/* Has the child exited within timeout_ms (-1: no limit)? 1: yes, 0: not yet. */
int child_exited(const struct child *c, int timeout_ms)
{
	struct pollfd exited = { c->pidfd, POLLIN, 0 };
	long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	int r;

	while ((r = poll(&exited, 1, ms_left(deadline))) < 0 && errno == EINTR)
		;
	if (r < 0) {
		slurm_error("spank_berth: poll on process %ld: %m", (long)c->pid);
		return 1;
	}
	return r > 0;
}

/*
 * Still ours: running, or exited and reaped by nobody? Then neither its pid
 * nor its process group id can have been given to another process.
 * (slurmstepd's wait loop reaps any of its children that exits.)
 */
static int child_held(const struct child *c)
{
	siginfo_t info;

	memset(&info, 0, sizeof(info));
	return waitid((idtype_t)P_PIDFD, (id_t)c->pidfd, &info,
		      WEXITED | WNOHANG | WNOWAIT) == 0;
}

/* Is the child stopped (SIGSTOP, SIGTSTP) now? Asked, not reaped (WNOWAIT). */
int child_stopped(const struct child *c)
{
	siginfo_t info;

	memset(&info, 0, sizeof(info));
	if (c->pidfd < 0 || waitid((idtype_t)P_PIDFD, (id_t)c->pidfd, &info,
				   WSTOPPED | WNOHANG | WNOWAIT) < 0)
		return 0;
	return info.si_pid != 0 && info.si_code == CLD_STOPPED;
}

/* Signal the child through its pidfd: a process gone is no error, nor is a reused pid a target. */
void child_signal(const struct child *c, int sig)
{
	if (syscall(SYS_pidfd_send_signal, c->pidfd, sig, NULL, 0) < 0 && errno != ESRCH)
		slurm_error("spank_berth: cannot send signal %d to process %ld: %m",
			    sig, (long)c->pid);
}

/* Reap the child if it has exited and is still ours; forget it. */
void child_release(struct child *c)
{
	siginfo_t info;

	if (c->pidfd < 0)
		return;
	memset(&info, 0, sizeof(info));
	while (waitid((idtype_t)P_PIDFD, (id_t)c->pidfd, &info, WEXITED | WNOHANG) < 0 &&
	       errno == EINTR)
		;
	close(c->pidfd);
	c->pidfd = -1;
	c->pid = 0;
}

/*
 * Wait for the child until deadline (now_ms() time, -1: none). Past it, its
 * whole process group is killed (spawn gave it one) and the one line that
 * says so names what and timeout_s. 0 and its wait status, or -1.
 */
int child_wait(struct child *c, long long deadline, const char *what, int timeout_s,
	       int *status)
{
	siginfo_t info;
	int rc = 0;

	if (!child_exited(c, ms_left(deadline))) {
		slurm_error("spank_berth: %s timed out after %d s; its processes were killed",
			    what, timeout_s);
		if (child_held(c) && kill(-c->pid, SIGKILL) < 0 && errno != ESRCH)
			slurm_error("spank_berth: cannot kill process group %ld: %m", (long)c->pid);
		child_signal(c, SIGKILL);
		child_exited(c, 5000);
		child_release(c);
		return -1;
	}
	memset(&info, 0, sizeof(info));
	while ((rc = waitid((idtype_t)P_PIDFD, (id_t)c->pidfd, &info, WEXITED)) < 0 &&
	       errno == EINTR)
		;
	if (rc < 0)
		slurm_error("spank_berth: %s: cannot get its exit status: %m", what);
	else if (info.si_code == CLD_EXITED)
		*status = (info.si_status & 0xff) << 8;
	else
		*status = info.si_status & 0x7f;
	close(c->pidfd);
	c->pidfd = -1;
	c->pid = 0;
	return rc < 0 ? -1 : 0;
}

/* The job's groups; in the epilog Slurm has no group list: the primary group will do. */
static void job_groups(spank_t sp, const struct step *st, const gid_t **groups, int *ngroups)
{
	if (sp == NULL ||
	    spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, groups, ngroups) != ESPANK_SUCCESS ||
	    *groups == NULL || *ngroups < 0) {
		*groups = &st->gid;
		*ngroups = 1;
	}
}

/*
 * In a forked child: leave slurmstepd's identity for the job user's, for
 * good. In user_init slurmstepd has switched only its effective uid (real
 * and saved uid 0): root comes back first, so that the group list is set
 * and nothing is left to switch back to. oom_score_adj is slurmstepd's
 * (SLURMSTEPD_OOM_ADJ) until reset here to 0, as Slurm does for tasks,
 * while /proc/self is still ours to write. Async-signal-safe calls only.
 */
static int become_user(const struct step *st, const gid_t *groups, int ngroups, int *oom_failed)
{
	static const char zero[] = "0\n";
	int fd;

	if (getuid() == 0 && geteuid() != 0 && seteuid(0) < 0)
		return -1;
	fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	*oom_failed = fd < 0 || write(fd, zero, sizeof(zero) - 1) != (ssize_t)sizeof(zero) - 1;
	if (fd >= 0)
		close(fd);
	if (geteuid() == 0 && setgroups((size_t)ngroups, groups) < 0)
		return -1;
	if (setresgid(st->gid, st->gid, st->gid) < 0 ||
	    setresuid(st->uid, st->uid, st->uid) < 0)
		return -1;
	if (st->uid != 0 && (geteuid() == 0 || setresuid((uid_t)-1, 0, (uid_t)-1) == 0))
		return -1;
	return 0;
}

/*
 * Fork a child that is the job user (setgroups, setresgid, setresuid), in a
 * process group of its own, with default signals. The parent holds it by a
 * pidfd opened before the child may exit: the child waits for that on a
 * pipe, and while it waits it is root's, out of the user's reach. st NULL
 * (the submission side): the child stays the caller, in its process group,
 * and is killed when the caller's thread ends (a resolve left running by an
 * srun that failed to allocate). Returns 0 in the child, 1 in the parent (c
 * filled in), -1 (logged) on failure.
 */
int fork_user(struct child *c, const struct step *st, const gid_t *groups, int ngroups,
	      int *oom_failed)
{
	int go[2] = { -1, -1 };
	char ok = 1;
	pid_t parent = getpid(), pid;

	*oom_failed = 0;
	c->pid = 0;
	c->pidfd = -1;
	if (pipe2(go, O_CLOEXEC) < 0) {
		slurm_error("spank_berth: pipe: %m");
		return -1;
	}
	pid = fork();
	if (pid == 0) {
		sigset_t none;
		ssize_t n;

		/* slurmstepd's blocked and ignored signals must not reach the runtime */
		for (int sig = 1; sig < NSIG; sig++)
			signal(sig, SIG_DFL);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		close(go[1]);
		if (st != NULL ? setpgid(0, 0) < 0
			       : prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(EXIT_NO_USER);
		while ((n = read(go[0], &ok, 1)) < 0 && errno == EINTR)
			;
		close(go[0]);
		if (n != 1 || (st != NULL && become_user(st, groups, ngroups, oom_failed) < 0))
			_exit(EXIT_NO_USER);
		return 0;
	}
	close(go[0]);
	if (pid < 0) {
		slurm_error("spank_berth: fork: %m");
		close(go[1]);
		return -1;
	}
	c->pid = pid;
	c->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (c->pidfd < 0 || write(go[1], &ok, 1) != 1) {
		slurm_error("spank_berth: cannot hold process %ld by a pidfd: %m", (long)pid);
		close(go[1]);
		/* blocked on the pipe, unreaped: this pid is still our child's */
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		if (c->pidfd >= 0)
			close(c->pidfd);
		c->pidfd = -1;
		c->pid = 0;
		return -1;
	}
	close(go[1]);
	return 1;
}

/*
 * Start argv (fork_user): on the node as st's job user, in its step dir; st
 * NULL: as the caller, where it is (the submission side). The child's
 * stdin, stdout, stderr as io says; env NULL: the caller's environment.
 * Only async-signal-safe calls after fork: slurmstepd and srun have
 * threads. 0 or -1.
 */
int spawn(spank_t sp, const struct step *st, char *const argv[], char **env,
	  const struct child_io *io, struct child *c)
{
	static const char oom_msg[] = "spank_berth: cannot reset oom_score_adj to 0\n";
	const gid_t *groups = NULL;
	int ngroups = 0, oom_failed = 0;
	int null_fd, err_fd, forked;

	if (st != NULL)
		job_groups(sp, st, &groups, &ngroups);
	null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null_fd < 0) {
		slurm_error("spank_berth: cannot open /dev/null: %m");
		return -1;
	}
	forked = fork_user(c, st, groups, ngroups, &oom_failed);
	if (forked == 0) {
		err_fd = io->err_path == NULL ? (io->err_fd >= 0 ? io->err_fd : null_fd)
			 : open(io->err_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
		if (err_fd < 0 || dup2(err_fd, 2) < 0 ||
		    dup2(io->in_fd >= 0 ? io->in_fd : null_fd, 0) < 0 ||
		    dup2(io->out_fd >= 0 ? io->out_fd : null_fd, 1) < 0)
			_exit(EXIT_NO_LOG);
		if (oom_failed && write(2, oom_msg, sizeof(oom_msg) - 1) < 0)
			_exit(EXIT_NO_LOG);
		/* slurmstepd's (or srun's) own fds are none of the runtime's business */
		if (close_range(3, ~0U, 0) < 0)
			for (int fd = 3; fd < 1024; fd++)
				close(fd);
		if (st != NULL && chdir(st->step_dir[0] ? st->step_dir : "/") < 0)
			_exit(EXIT_NO_LOG);
		execve(argv[0], argv, env != NULL ? env : environ);
		_exit(127);
	}
	close(null_fd);
	return forked < 0 ? -1 : 0;
}

/*
 * Read a started child's stdout and stderr (child_read in child.h): both
 * at once, since a child blocked on a full pipe would never exit.
 */
int child_read(struct child_output *o, long long deadline, const char *slow_notice)
{
	struct pollfd fds[2] = { { o->out_fd, POLLIN, 0 }, { o->err_fd, POLLIN, 0 } };
	long long notice_at = slow_notice != NULL ? now_ms() + SLOW_NOTICE_MS : -1;
	int rc = 0;

	o->used = o->err_used = 0;
	o->overflow = 0;
	while (fds[0].fd >= 0 || fds[1].fd >= 0) {
		int waited = notice_at >= 0 ? ms_left(notice_at) : ms_left(deadline);
		int r = poll(fds, 2, deadline >= 0 && ms_left(deadline) < waited ? ms_left(deadline)
										 : waited);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			slurm_error("spank_berth: poll: %m");
			rc = -1;
			break;
		}
		if (r == 0 && notice_at >= 0 && ms_left(notice_at) == 0) {
			slurm_spank_log("spank_berth: %s", slow_notice);
			notice_at = -1;
			continue;
		}
		if (r == 0) /* past the deadline: child_wait says so */
			break;
		notice_at = -1; /* it has printed: no notice */
		if (fds[0].revents) {
			char sink[4096];
			ssize_t n = o->used + 1 < o->outlen
				? read(fds[0].fd, o->out + o->used, o->outlen - 1 - o->used)
				: read(fds[0].fd, sink, sizeof(sink));

			if (n > 0 && o->used + 1 < o->outlen)
				o->used += (size_t)n;
			else if (n > 0)
				o->overflow = 1;
			else if (n == 0 || errno != EINTR)
				fds[0].fd = -1;
		}
		if (fds[1].revents) {
			size_t half = sizeof(o->err) / 2;
			ssize_t n;

			if (o->err_used > half) { /* keep the tail: the last line counts */
				memmove(o->err, o->err + o->err_used - half, half);
				o->err_used = half;
			}
			n = read(fds[1].fd, o->err + o->err_used, sizeof(o->err) - o->err_used);
			if (n > 0)
				o->err_used += (size_t)n;
			else if (n == 0 || errno != EINTR)
				fds[1].fd = -1;
		}
	}
	if (o->outlen > 0)
		o->out[o->used] = '\0';
	return rc;
}

/*
 * The last (up to len - 1) bytes of a regular file below the user's tree,
 * NUL-terminated; "" when there is none. Root reads it through a child that
 * is the user: any directory on the way may be a link the user put there.
 */
void read_user_tail(const struct step *st, const char *path, char *buf, size_t len)
{
	int pipe_fds[2] = { -1, -1 };
	struct child reader;
	size_t used = 0;
	int oom_failed, status;
	long long deadline;

	buf[0] = '\0';
	if (pipe2(pipe_fds, O_CLOEXEC) < 0) {
		slurm_error("spank_berth: pipe: %m");
		return;
	}
	switch (fork_user(&reader, st, &st->gid, 1, &oom_failed)) {
	case 0: {
		char chunk[4096];
		struct stat sb;
		ssize_t n;
		int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

		if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))
			_exit(1);
		if (sb.st_size > (off_t)len - 1 &&
		    lseek(fd, sb.st_size - (off_t)len + 1, SEEK_SET) < 0)
			_exit(1);
		while ((n = read(fd, chunk, sizeof(chunk))) > 0)
			if (write(pipe_fds[1], chunk, (size_t)n) != n)
				_exit(1);
		_exit(n < 0);
	}
	case -1:
		close(pipe_fds[0]);
		close(pipe_fds[1]);
		return;
	}
	close(pipe_fds[1]);
	deadline = now_ms() + READ_TIMEOUT_MS;
	for (;;) {
		struct pollfd readable = { pipe_fds[0], POLLIN, 0 };
		ssize_t n;
		int r = poll(&readable, 1, ms_left(deadline));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n = read(pipe_fds[0], buf + used, len - 1 - used);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		used += (size_t)n;
		if (used == len - 1)
			break;
	}
	buf[used] = '\0';
	close(pipe_fds[0]);
	child_wait(&reader, deadline, "reading a log as the user",
		   READ_TIMEOUT_MS / 1000, &status);
}
