/*
 * spank_berth: pyxis-compatible --container-* flags for srun/sbatch/salloc.
 *
 * A thin caller of the berth runtime. Per step and node (slurmstepd):
 *   init_post_opt (root)  make runtime_path/<uid>/ for the user; the plugin
 *                         keeps its files in runtime_path/<uid>/spank/
 *   user_init (user)      berth import (registry images, into the user's image
 *                         cache on the node), berth create (named containers), then
 *                         "berth start --detach", which prints the container
 *                         pid and lives until its stdin closes
 *   task_init (user)      join that pid's namespaces, chdir, merge env
 *   task_exit (root)      after the last local task: close the keeper's
 *                         stdin, berth export, berth remove
 * Flag values are checked on the submission side (options.c) so a bad flag
 * fails srun/sbatch before anything runs.
 */
#define _GNU_SOURCE
#include "options.h"
#include "seccomp_filter.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/seccomp.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#define BERTH_SPANK_VERSION "0.1.0"

/*
 * Registered under pyxis's name: Slurm exports a submission's option values
 * to the job as SLURM_SPANK__SLURM_SPANK_OPTION_<plugin>_<option>, and job
 * scripts read and unset those by pyxis's name.
 */
SPANK_PLUGIN(pyxis, 1);

static struct plugin_conf conf;
static struct container_flags flags;

/*
 * A process the plugin forked, held by a pidfd opened before it could exit
 * (fork_user): signals and waits go through the pidfd, never through a pid
 * that the process may have left to another one.
 */
struct child {
	pid_t pid;
	int pidfd; /* -1: none */
};

#ifndef P_PIDFD
#define P_PIDFD 3 /* waitid on a pidfd, Linux 5.4 */
#endif

/* One step on one node (remote context). */
static struct {
	int active;
	uid_t uid;
	gid_t gid;
	uint32_t jobid;
	uint32_t stepid;
	char label[32];            /* "JOBID.STEPID", or "JOBID.batch" */
	char user_dir[PATH_MAX];   /* runtime_path/<uid>, shared with the runtime */
	char state_dir[PATH_MAX];  /* user_dir/spank: named/, steps, a custom importer's images/ */
	char step_dir[PATH_MAX];   /* state_dir/<jobid>.<stepid>: logs */
	char container[NAME_MAX];  /* container name given to berth, or "" */
	int remove_container;      /* created for --container-save only */
	char pidfile[PATH_MAX];    /* named container's pid file we wrote, or "" */
	struct child keeper;       /* our "berth start --detach", or pidfd -1 */
	int keeper_stdin;          /* closing it stops the keeper */
	pid_t container_pid;       /* the pid whose namespaces tasks join */
	uint32_t tasks_left;       /* local tasks still running */
	int setup_failed;          /* user_init could not make the container */
} step = { .keeper = { 0, -1 }, .keeper_stdin = -1 };

enum opt_id {
	OPT_IMAGE, OPT_MOUNTS, OPT_WORKDIR, OPT_NAME, OPT_SAVE,
	OPT_MOUNT_HOME, OPT_NO_MOUNT_HOME, OPT_REMAP_ROOT, OPT_NO_REMAP_ROOT,
	OPT_ENTRYPOINT, OPT_NO_ENTRYPOINT, OPT_ENTRYPOINT_LOG,
	OPT_WRITABLE, OPT_READONLY, OPT_ENV, OPT_UNSHARE, OPT_ENVIRONMENT,
};

/*
 * The EDF is resolved once, at submission (the submitting environment
 * expands its ${VAR}s), and its values reach the nodes in the job's
 * environment under this name: see edf_body() in options.h. SLURM_* names
 * survive sbatch --export=NONE, so a containerized batch step finds it too.
 */
#define EDF_VAR "SLURM_BERTH_EDF"
#define EDF_MAX 65536

static int on_option(int val, const char *optarg, int remote);

static struct spank_option options[] = {
	{ "container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
	  "[berth] the image to run the step in", 1, OPT_IMAGE, on_option },
	{ "container-mounts", "SRC[:DST[:FLAGS]]|tmpfs:DST[:OPTS]|umount:DST[,...]",
	  "[berth] mounts, FLAGS joined with '+' (ro, rbind, ...)", 1, OPT_MOUNTS, on_option },
	{ "container-workdir", "PATH",
	  "[berth] working directory inside the container", 1, OPT_WORKDIR, on_option },
	{ "container-name", "NAME[:create|:exec|:no_exec|:auto]",
	  "[berth] name the container so later steps reuse it", 1, OPT_NAME, on_option },
	{ "container-save", "PATH",
	  "[berth] save the container to a squashfs file after the step", 1, OPT_SAVE, on_option },
	{ "container-mount-home", NULL,
	  "[berth] bind mount the user's home directory", 0, OPT_MOUNT_HOME, on_option },
	{ "no-container-mount-home", NULL,
	  "[berth] do not bind mount the user's home directory", 0, OPT_NO_MOUNT_HOME, on_option },
	{ "container-remap-root", NULL,
	  "[berth] become root inside the container", 0, OPT_REMAP_ROOT, on_option },
	{ "no-container-remap-root", NULL,
	  "[berth] stay yourself inside the container", 0, OPT_NO_REMAP_ROOT, on_option },
	{ "container-entrypoint", NULL,
	  "[berth] run the image entrypoint first (it must exec \"$@\")", 0, OPT_ENTRYPOINT, on_option },
	{ "no-container-entrypoint", NULL,
	  "[berth] do not run the image entrypoint", 0, OPT_NO_ENTRYPOINT, on_option },
	{ "container-entrypoint-log", NULL,
	  "[berth] show the entrypoint's output on the step's stderr", 0, OPT_ENTRYPOINT_LOG, on_option },
	{ "container-writable", NULL,
	  "[berth] make the container filesystem writable", 0, OPT_WRITABLE, on_option },
	{ "container-readonly", NULL,
	  "[berth] make the container filesystem read-only", 0, OPT_READONLY, on_option },
	{ "container-env", "NAME[,NAME...]",
	  "[berth] variables whose task value beats the image's", 1, OPT_ENV, on_option },
	{ "container-unshare", "net,ipc,uts",
	  "[berth] give the container its own namespaces", 1, OPT_UNSHARE, on_option },
	{ "environment", "NAME|PATH.toml",
	  "[berth] an Environment Definition File; --container-* flags override it", 1,
	  OPT_ENVIRONMENT, on_option },
	SPANK_OPTIONS_TABLE_END
};

static int on_option(int val, const char *optarg, int remote)
{
	char err[ERR_LEN] = "";
	int rc = 0;

	switch (val) {
	case OPT_IMAGE:
		rc = set_image(&flags, optarg, !remote, err, sizeof(err));
		break;
	case OPT_MOUNTS:
		rc = set_mounts(&flags, optarg, err, sizeof(err));
		break;
	case OPT_WORKDIR:
		rc = set_workdir(&flags, optarg, err, sizeof(err));
		break;
	case OPT_NAME:
		rc = set_name(&flags, optarg, err, sizeof(err));
		break;
	case OPT_SAVE:
		rc = set_save(&flags, optarg, err, sizeof(err));
		break;
	case OPT_ENV:
		rc = set_env_names(&flags, optarg, err, sizeof(err));
		break;
	case OPT_UNSHARE:
		rc = set_unshare(&flags, optarg, err, sizeof(err));
		break;
	case OPT_ENVIRONMENT:
		rc = set_environment(&flags, optarg, err, sizeof(err));
		break;
	case OPT_MOUNT_HOME:
		rc = set_switch(&flags, SW_MOUNT_HOME, err, sizeof(err));
		break;
	case OPT_NO_MOUNT_HOME:
		rc = set_switch(&flags, SW_NO_MOUNT_HOME, err, sizeof(err));
		break;
	case OPT_REMAP_ROOT:
		rc = set_switch(&flags, SW_REMAP_ROOT, err, sizeof(err));
		break;
	case OPT_NO_REMAP_ROOT:
		rc = set_switch(&flags, SW_NO_REMAP_ROOT, err, sizeof(err));
		break;
	case OPT_ENTRYPOINT:
		rc = set_switch(&flags, SW_ENTRYPOINT, err, sizeof(err));
		break;
	case OPT_NO_ENTRYPOINT:
		rc = set_switch(&flags, SW_NO_ENTRYPOINT, err, sizeof(err));
		break;
	case OPT_ENTRYPOINT_LOG:
		rc = set_switch(&flags, SW_ENTRYPOINT_LOG, err, sizeof(err));
		break;
	case OPT_WRITABLE:
		rc = set_switch(&flags, SW_WRITABLE, err, sizeof(err));
		break;
	case OPT_READONLY:
		rc = set_switch(&flags, SW_READONLY, err, sizeof(err));
		break;
	default:
		snprintf(err, sizeof(err), "unknown option id %d", val);
		rc = -1;
	}
	if (rc < 0)
		slurm_error("spank_berth: %s", err);
	return rc;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	char err[ERR_LEN];

	flags_init(&flags);
	if (conf_parse(&conf, ac, av, err, sizeof(err)) < 0) {
		slurm_error("spank_berth: plugstack.conf: %s", err);
		return -1;
	}
	if (ctx == S_CTX_ALLOCATOR && !conf.sbatch_support)
		return 0;
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR)
		return 0;
	for (struct spank_option *opt = options; opt->name != NULL; opt++) {
		spank_err_t rc = spank_option_register(sp, opt);

		if (rc != ESPANK_SUCCESS) {
			slurm_error("spank_berth: cannot register --%s: %s",
				    opt->name, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* ---- helpers for the remote side ---------------------------------------- */

static int path_join(char *out, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int path_join(char *out, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(out, PATH_MAX, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= PATH_MAX) {
		slurm_error("spank_berth: path too long: %s...", out);
		return -1;
	}
	return 0;
}

/* mkdir that accepts an existing directory owned by uid; as root, chown it to uid:gid. */
static int make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid)
{
	struct stat st;

	if (mkdir(path, mode) == 0) {
		if (geteuid() == 0 && chown(path, uid, gid) < 0) {
			slurm_error("spank_berth: cannot chown %s: %m", path);
			return -1;
		}
		return 0;
	}
	if (errno != EEXIST) {
		slurm_error("spank_berth: cannot create %s: %m", path);
		return -1;
	}
	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
		slurm_error("spank_berth: %s exists and is not a directory", path);
		return -1;
	}
	if (st.st_uid != uid) {
		slurm_error("spank_berth: %s is owned by uid %u, not %u",
			    path, (unsigned)st.st_uid, (unsigned)uid);
		return -1;
	}
	return 0;
}

static int wait_child(pid_t pid, int *status)
{
	while (waitpid(pid, status, 0) < 0) {
		if (errno != EINTR)
			return -1;
	}
	return 0;
}

/* ---- --environment on the submission side ---------------------------------- */

/* Keep the last line of text (of used bytes) in msg, without "berth: error: ". */
static void last_line(const char *text, size_t used, char *msg, size_t msglen)
{
	static const char prefix[] = "berth: error: ";
	const char *end = text + used, *start;

	while (end > text && (end[-1] == '\n' || end[-1] == '\r'))
		end--;
	for (start = end; start > text && start[-1] != '\n'; start--)
		;
	if ((size_t)(end - start) >= sizeof(prefix) - 1 &&
	    strncmp(start, prefix, sizeof(prefix) - 1) == 0)
		start += sizeof(prefix) - 1;
	snprintf(msg, msglen, "%.*s", (int)(end - start), start);
}

/*
 * Run argv as the submitting user in its environment: stdout into out (NUL
 * terminated), on failure the last stderr line into msg. 0: exit status 0.
 */
static int capture(char *const argv[], char *out, size_t outlen, char *msg, size_t msglen)
{
	char errbuf[4096];
	size_t used = 0, errused = 0;
	int out_pipe[2] = { -1, -1 }, err_pipe[2] = { -1, -1 };
	int status = 0, overflow = 0, rc = -1;
	pid_t pid = -1;

	if (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0) {
		snprintf(msg, msglen, "pipe: %s", strerror(errno));
		goto out;
	}
	pid = fork();
	if (pid == 0) {
		int null_fd = open("/dev/null", O_RDONLY);

		if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(out_pipe[1], 1) < 0 ||
		    dup2(err_pipe[1], 2) < 0)
			_exit(126);
		execv(argv[0], argv);
		_exit(127);
	}
	if (pid < 0) {
		snprintf(msg, msglen, "fork: %s", strerror(errno));
		goto out;
	}
	close(out_pipe[1]);
	close(err_pipe[1]);
	out_pipe[1] = err_pipe[1] = -1;
	/* both pipes at once: a child blocked on a full one would never exit */
	for (struct pollfd fds[2] = { { out_pipe[0], POLLIN, 0 }, { err_pipe[0], POLLIN, 0 } };
	     fds[0].fd >= 0 || fds[1].fd >= 0;) {
		char sink[4096];
		ssize_t n;

		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			snprintf(msg, msglen, "poll: %s", strerror(errno));
			goto out;
		}
		if (fds[0].revents) {
			n = used + 1 < outlen ? read(fds[0].fd, out + used, outlen - 1 - used)
					      : read(fds[0].fd, sink, sizeof(sink));
			if (n > 0 && used + 1 < outlen)
				used += (size_t)n;
			else if (n > 0)
				overflow = 1;
			else if (n == 0 || errno != EINTR)
				fds[0].fd = -1;
		}
		if (fds[1].revents) {
			if (errused > sizeof(errbuf) / 2) { /* keep the tail: the last line counts */
				memmove(errbuf, errbuf + errused - sizeof(errbuf) / 2, sizeof(errbuf) / 2);
				errused = sizeof(errbuf) / 2;
			}
			n = read(fds[1].fd, errbuf + errused, sizeof(errbuf) - errused);
			if (n > 0)
				errused += (size_t)n;
			else if (n == 0 || errno != EINTR)
				fds[1].fd = -1;
		}
	}
	out[used] = '\0';
	if (wait_child(pid, &status) < 0)
		snprintf(msg, msglen, "waitpid: %s", strerror(errno));
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !overflow)
		rc = 0;
	else if (overflow)
		snprintf(msg, msglen, "%s printed more than %zu bytes", argv[0], outlen - 1);
	else if (errused > 0)
		last_line(errbuf, errused, msg, msglen);
	else if (WIFEXITED(status) && WEXITSTATUS(status) >= 126)
		snprintf(msg, msglen, "cannot execute %s", argv[0]);
	else
		snprintf(msg, msglen, "%s failed with status %d", argv[0], status);
	pid = -1;
out:
	/* closed before the wait: a child writing to a full pipe gets EPIPE, not stuck */
	for (int i = 0; i < 2; i++) {
		if (out_pipe[i] >= 0)
			close(out_pipe[i]);
		if (err_pipe[i] >= 0)
			close(err_pipe[i]);
	}
	if (pid > 0)
		wait_child(pid, &status);
	return rc;
}

/*
 * Resolve --environment through the runtime and put the result into this
 * process's environment, which srun/sbatch/salloc hand to the job. A job
 * step inside an sbatch/salloc of the same environment finds it there
 * already: resolved once, at the first submission.
 */
static int submit_environment(void)
{
	char *argv[] = { conf.berth, "edf", "show", "--spank", flags.environment, NULL };
	const char *inherited = getenv(EDF_VAR);
	char msg[ERR_LEN], err[ERR_LEN];
	char *text = NULL;
	int header, rc = -1;

	if (inherited != NULL && edf_body(inherited, flags.environment) != NULL) {
		if (apply_edf(&flags, edf_body(inherited, flags.environment), 1,
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
	header = snprintf(text, EDF_MAX, "environment=%s\n", flags.environment);
	if (header < 0 || header >= EDF_MAX / 2) {
		slurm_error("spank_berth: --environment: the name is too long");
		goto out;
	}
	if (capture(argv, text + header, EDF_MAX - (size_t)header, msg, sizeof(msg)) < 0) {
		slurm_error("spank_berth: --environment: %s", msg);
		goto out;
	}
	if (apply_edf(&flags, text + header, 1, err, sizeof(err)) < 0) {
		slurm_error("spank_berth: %s", err);
		goto out;
	}
	if (setenv(EDF_VAR, text, 1) < 0) {
		slurm_error("spank_berth: --environment: cannot set %s: %m", EDF_VAR);
		goto out;
	}
	rc = 0;
out:
	free(text);
	return rc;
}

/* On the node: the values resolved at submission, from the job's environment. */
static int node_environment(spank_t sp)
{
	char err[ERR_LEN];
	char *text = malloc(EDF_MAX);
	const char *body = NULL;
	spank_err_t got;
	int rc = -1;

	if (text == NULL) {
		slurm_error("spank_berth: out of memory");
		return -1;
	}
	got = spank_getenv(sp, EDF_VAR, text, EDF_MAX);
	if (got == ESPANK_SUCCESS)
		body = edf_body(text, flags.environment);
	if (body == NULL)
		slurm_error("spank_berth: --environment: '%s' resolved at submission did not reach "
			    "the node (%s: %s; does --export drop it?)", flags.environment, EDF_VAR,
			    got == ESPANK_SUCCESS ? "for another environment" : spank_strerror(got));
	else if (apply_edf(&flags, body, 0, err, sizeof(err)) < 0)
		slurm_error("spank_berth: %s", err);
	else
		rc = 0;
	free(text);
	return rc;
}

/*
 * Steps that never run in a container: the extern and interactive steps.
 * The batch step does when sbatch was given container flags, as with pyxis.
 */
static int special_step(uint32_t stepid)
{
	return stepid == SLURM_EXTERN_CONT || stepid == SLURM_INTERACTIVE_STEP ||
	       (stepid == SLURM_BATCH_SCRIPT && !conf.sbatch_support);
}

/* "JOBID.STEPID" as scontrol writes it ("batch" for the batch step). */
static int step_label(char *out, size_t outlen, uint32_t jobid, uint32_t stepid)
{
	int n = stepid == SLURM_BATCH_SCRIPT ? snprintf(out, outlen, "%u.batch", jobid)
					     : snprintf(out, outlen, "%u.%u", jobid, stepid);

	return n < 0 || (size_t)n >= outlen ? -1 : 0;
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

/*
 * With sbatch --export=NONE, Slurm does not hand the batch step the flags
 * that sbatch gave, though the job's environment has them (as
 * SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_<flag>): read them from there, or
 * the script would run on the host. Only when none arrived.
 */
static int batch_options_from_env(spank_t sp)
{
	char name[128], value[PATH_MAX * 4];

	for (struct spank_option *opt = options; opt->name != NULL; opt++) {
		int n = snprintf(name, sizeof(name), "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_%s",
				 opt->name);

		for (char *c = name + n - strlen(opt->name); *c; c++)
			*c = *c == '-' ? '_' : *c;
		if (spank_getenv(sp, name, value, sizeof(value)) != ESPANK_SUCCESS)
			continue;
		if (on_option(opt->val, opt->has_arg ? value : NULL, 1) < 0)
			return -1;
	}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char err[ERR_LEN];
	int remote = spank_context() == S_CTX_REMOTE;

	(void)ac;
	(void)av;
	/* no flags registered there: no PYXIS_CONTAINER_* either */
	if (spank_context() == S_CTX_ALLOCATOR && !conf.sbatch_support)
		return 0;
	/* the flags win over the variables, and both over the EDF */
	if (apply_pyxis_env(&flags, remote ? job_env : local_env, sp, !remote,
			    err, sizeof(err)) < 0) {
		slurm_error("spank_berth: %s", err);
		return -1;
	}
	if (!remote) {
		if (flags.environment != NULL && submit_environment() < 0)
			return -1;
		if (flags_check(&flags, err, sizeof(err)) < 0) {
			slurm_error("spank_berth: %s", err);
			return -1;
		}
		return 0;
	}
	if (spank_get_item(sp, S_JOB_STEPID, &step.stepid) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: cannot read the step id");
		return -1;
	}
	if (step.stepid == SLURM_BATCH_SCRIPT && conf.sbatch_support &&
	    !flags_want_container(&flags) && flags.environment == NULL &&
	    batch_options_from_env(sp) < 0)
		return -1;
	if (!flags_want_container(&flags) && flags.environment == NULL)
		return 0;
	if (spank_get_item(sp, S_JOB_UID, &step.uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &step.gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &step.jobid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step.stepid) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: cannot read the job's uid, gid or ids");
		return -1;
	}
	if (special_step(step.stepid))
		return 0;
	if (flags.environment != NULL && node_environment(sp) < 0)
		return -1;
	/* runtime_path is root's; the per-user dir below it is the user's (pyxis#4). */
	if (step_label(step.label, sizeof(step.label), step.jobid, step.stepid) < 0 ||
	    make_dir(conf.runtime_path, 0755, 0, 0) < 0 ||
	    path_join(step.user_dir, "%s/%u", conf.runtime_path, (unsigned)step.uid) < 0 ||
	    make_dir(step.user_dir, 0700, step.uid, step.gid) < 0 ||
	    path_join(step.state_dir, "%s/spank", step.user_dir) < 0 ||
	    path_join(step.step_dir, "%s/%s", step.state_dir, step.label) < 0)
		return -1;
	if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &step.tasks_left) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: cannot read the step's task count");
		return -1;
	}
	step.active = 1;
	return 0;
}

/* A login's environment for the job user, where Slurm has no job env (epilog). */
static char **login_env(void)
{
	static char home[PATH_MAX + 8], user[64], logname[64];
	static char path[] = "PATH=/usr/local/bin:/usr/bin:/bin";
	static char *env[] = { home, user, logname, path, NULL };
	char buf[4096];
	struct passwd pw, *found = NULL;

	if (getpwuid_r(step.uid, &pw, buf, sizeof(buf), &found) != 0 || found == NULL) {
		slurm_error("spank_berth: no passwd entry for uid %u", (unsigned)step.uid);
		return NULL;
	}
	snprintf(home, sizeof(home), "HOME=%s", pw.pw_dir);
	snprintf(user, sizeof(user), "USER=%s", pw.pw_name);
	snprintf(logname, sizeof(logname), "LOGNAME=%s", pw.pw_name);
	return env;
}

/* NULL-terminated copy of the job env with KEY=VALUE overrides replacing their keys. */
static char **child_env(spank_t sp, char **overrides, int noverrides)
{
	char **job_env = NULL;
	char **env;
	int n = 0, out = 0;

	if (spank_get_item(sp, S_JOB_ENV, &job_env) != ESPANK_SUCCESS || job_env == NULL)
		job_env = login_env();
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

/* Exit codes of a child that failed before exec (see report_failure). */
#define EXIT_NO_USER 126
#define EXIT_NO_LOG 125

/* How long root waits for a child that only reads a log for it. */
#define READ_TIMEOUT_MS 10000

/* ---- children of the plugin ------------------------------------------------ */

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds until deadline (now_ms() time; -1: none) as a poll timeout. */
static int ms_left(long long deadline)
{
	long long left;

	if (deadline < 0)
		return -1;
	left = deadline - now_ms();
	return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

/* Has the child exited within timeout_ms (-1: no limit)? 1: yes, 0: not yet. */
static int child_exited(const struct child *c, int timeout_ms)
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

/* Signal the child through its pidfd: a process gone is no error, nor is a reused pid a target. */
static void child_signal(const struct child *c, int sig)
{
	if (syscall(SYS_pidfd_send_signal, c->pidfd, sig, NULL, 0) < 0 && errno != ESRCH)
		slurm_error("spank_berth: cannot send signal %d to process %ld: %m",
			    sig, (long)c->pid);
}

/* Reap the child if it has exited and is still ours; forget it. */
static void child_release(struct child *c)
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
static int child_wait(struct child *c, long long deadline, const char *what, int timeout_s,
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
static void job_groups(spank_t sp, gid_t **groups, int *ngroups)
{
	if (sp == NULL ||
	    spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, groups, ngroups) != ESPANK_SUCCESS ||
	    *groups == NULL || *ngroups < 0) {
		*groups = &step.gid;
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
static int become_user(const gid_t *groups, int ngroups, int *oom_failed)
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
	if (setresgid(step.gid, step.gid, step.gid) < 0 ||
	    setresuid(step.uid, step.uid, step.uid) < 0)
		return -1;
	if (step.uid != 0 && (geteuid() == 0 || setresuid((uid_t)-1, 0, (uid_t)-1) == 0))
		return -1;
	return 0;
}

/*
 * Fork a child that is the job user (setgroups, setresgid, setresuid), in a
 * process group of its own, with default signals. The parent holds it by a
 * pidfd opened before the child may exit: the child waits for that on a
 * pipe, and while it waits it is root's, out of the user's reach. Returns
 * 0 in the child, 1 in the parent (c filled in), -1 (logged) on failure.
 */
static int fork_user(struct child *c, const gid_t *groups, int ngroups, int *oom_failed)
{
	int go[2] = { -1, -1 };
	char ok = 1;
	pid_t pid;

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
		if (setpgid(0, 0) < 0)
			_exit(EXIT_NO_USER);
		while ((n = read(go[0], &ok, 1)) < 0 && errno == EINTR)
			;
		close(go[0]);
		if (n != 1 || become_user(groups, ngroups, oom_failed) < 0)
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
 * Start argv as the job user (fork_user). stdin/stdout of the child: the
 * given fds (-1: /dev/null); stderr: log_path, opened as the user. Only
 * async-signal-safe calls after fork: slurmstepd has threads. 0 or -1.
 */
static int spawn(spank_t sp, char *const argv[], char **env, int in_fd, int out_fd,
		 const char *log_path, struct child *c)
{
	static const char oom_msg[] = "spank_berth: cannot reset oom_score_adj to 0\n";
	gid_t *groups = NULL;
	int ngroups = 0, oom_failed = 0;
	int null_fd, log_fd, forked;

	job_groups(sp, &groups, &ngroups);
	null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null_fd < 0) {
		slurm_error("spank_berth: cannot open /dev/null: %m");
		return -1;
	}
	forked = fork_user(c, groups, ngroups, &oom_failed);
	if (forked == 0) {
		log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
		if (log_fd < 0 || dup2(log_fd, 2) < 0 ||
		    dup2(in_fd >= 0 ? in_fd : null_fd, 0) < 0 ||
		    dup2(out_fd >= 0 ? out_fd : null_fd, 1) < 0)
			_exit(EXIT_NO_LOG);
		if (oom_failed && write(2, oom_msg, sizeof(oom_msg) - 1) < 0)
			_exit(EXIT_NO_LOG);
		/* slurmstepd's own fds are none of the runtime's business */
		if (close_range(3, ~0U, 0) < 0)
			for (int fd = 3; fd < 1024; fd++)
				close(fd);
		if (chdir(step.step_dir[0] ? step.step_dir : "/") < 0)
			_exit(EXIT_NO_LOG);
		execve(argv[0], argv, env);
		_exit(127);
	}
	close(null_fd);
	return forked < 0 ? -1 : 0;
}

/*
 * The last (up to len - 1) bytes of a regular file below the user's tree,
 * NUL-terminated; "" when there is none. Root reads it through a child that
 * is the user: any directory on the way may be a link the user put there.
 */
static void read_user_tail(const char *path, char *buf, size_t len)
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
	switch (fork_user(&reader, &step.gid, 1, &oom_failed)) {
	case 0: {
		char chunk[4096];
		struct stat st;
		ssize_t n;
		int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

		if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
			_exit(1);
		if (st.st_size > (off_t)len - 1 &&
		    lseek(fd, st.st_size - (off_t)len + 1, SEEK_SET) < 0)
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

/*
 * Report why a runtime command failed: headline (if any) first, then its last
 * stderr line ("spank_berth: WHAT: LINE" after a headline).
 */
static void report_failure(const char *what, const char *log_path, int status,
			   const char *headline)
{
	char buf[4096];
	char *line;
	size_t n;

	if (strcmp(log_path, "/dev/null") == 0)
		buf[0] = '\0';
	else
		read_user_tail(log_path, buf, sizeof(buf));
	n = strlen(buf);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = '\0';
	line = strrchr(buf, '\n');
	line = line ? line + 1 : buf;
	if (headline != NULL && strncmp(line, "berth: error: ", 14) == 0)
		line += 14;
	if (headline != NULL)
		slurm_error("spank_berth: %s", headline);
	if (headline != NULL && *line != '\0')
		slurm_error("spank_berth: %s: %s", what, line);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_NO_USER)
		slurm_error("spank_berth: %s: cannot become uid %u", what, (unsigned)step.uid);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_NO_LOG)
		slurm_error("spank_berth: %s: cannot write %s as uid %u", what, log_path,
			    (unsigned)step.uid);
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
 * cleanup_timeout: the command runs as the user, who can stall it.
 * Logs and returns -1 on failure.
 */
static int run_cmd(spank_t sp, const char *what, char *const argv[], char *out, size_t outlen,
		   const char *slow_notice, const char *headline)
{
	int timeout_s = geteuid() == 0 ? conf.cleanup_timeout : 0;
	long long deadline = timeout_s > 0 ? now_ms() + 1000LL * timeout_s : -1;
	char log_path[PATH_MAX];
	char **env;
	int pipe_fds[2] = { -1, -1 };
	struct child cmd;
	size_t used = 0;
	int status = 0, rc;

	if (step.step_dir[0] == '\0')
		strcpy(log_path, "/dev/null");
	else if (path_join(log_path, "%s/%s.log", step.step_dir, argv[1]) < 0)
		return -1;
	env = child_env(sp, NULL, 0);
	if (env == NULL)
		return -1;
	if (out != NULL && pipe2(pipe_fds, O_CLOEXEC) < 0) {
		slurm_error("spank_berth: pipe: %m");
		free(env);
		return -1;
	}
	rc = spawn(sp, argv, env, -1, pipe_fds[1], log_path, &cmd);
	free(env);
	if (out != NULL) {
		struct pollfd printed = { pipe_fds[0], POLLIN, 0 };

		close(pipe_fds[1]);
		if (slow_notice != NULL && rc == 0 && poll(&printed, 1, 3000) == 0)
			slurm_spank_log("spank_berth: %s", slow_notice);
		while (rc == 0) {
			char sink[256];
			ssize_t n;
			int r = poll(&printed, 1, ms_left(deadline));

			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) /* past the deadline: child_wait says so */
				break;
			n = used + 1 < outlen ? read(pipe_fds[0], out + used, outlen - 1 - used)
					      : read(pipe_fds[0], sink, sizeof(sink));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			if (used + 1 < outlen)
				used += (size_t)n;
		}
		out[used] = '\0';
		close(pipe_fds[0]);
	}
	if (rc < 0)
		return -1;
	if (child_wait(&cmd, deadline, what, timeout_s, &status) < 0)
		return -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		report_failure(what, log_path, status, headline);
		return -1;
	}
	return 0;
}

static int run(spank_t sp, const char *what, char *const argv[], char *out, size_t outlen,
	       const char *slow_notice)
{
	return run_cmd(sp, what, argv, out, outlen, slow_notice, NULL);
}

/* Hold an exclusive lock on path; say so when another step holds it. */
static int lock_file(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0) {
		slurm_error("spank_berth: cannot open lock %s: %m", path);
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		return fd;
	slurm_spank_log("spank_berth: waiting for another step holding %s", path);
	while (flock(fd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			slurm_error("spank_berth: cannot lock %s: %m", path);
			close(fd);
			return -1;
		}
	}
	return fd;
}

/* A custom importer's copy of a registry image in state_dir/images, made once per node. */
static int import_with_importer(spank_t sp, const char *uri, char *sqsh)
{
	/* room in NAME_MAX for the ".<jobid>.<stepid>.tmp" of the download */
	char images[PATH_MAX], name[NAME_MAX - 32], lock[PATH_MAX], tmp[PATH_MAX];
	char headline[PATH_MAX + 64];
	char *argv[] = { conf.importer, "import", "-o", tmp, (char *)uri, NULL };
	int lock_fd, rc = 0;

	if (image_cache_name(flags.image, name, sizeof(name)) < 0) {
		slurm_error("spank_berth: --container-image: '%s' is too long", flags.image);
		return -1;
	}
	if (path_join(images, "%s/images", step.state_dir) < 0 ||
	    make_dir(images, 0700, step.uid, step.gid) < 0 ||
	    path_join(sqsh, "%s/%s", images, name) < 0 ||
	    path_join(lock, "%s.lock", sqsh) < 0 ||
	    path_join(tmp, "%s.%u.%u.tmp", sqsh, step.jobid, step.stepid) < 0)
		return -1;
	lock_fd = lock_file(lock);
	if (lock_fd < 0)
		return -1;
	if (faccessat(AT_FDCWD, sqsh, R_OK, AT_EACCESS) != 0) { /* as the user: real uid is root */
		slurm_spank_log("spank_berth: importing %s", uri);
		unlink(tmp);
		snprintf(headline, sizeof(headline), "failed to import docker image: %s", uri);
		rc = run_cmd(sp, "importer", argv, NULL, 0, NULL, headline);
		if (rc == 0 && rename(tmp, sqsh) < 0) {
			slurm_error("spank_berth: cannot rename %s to %s: %m", tmp, sqsh);
			rc = -1;
		}
		if (rc < 0)
			unlink(tmp);
	}
	close(lock_fd);
	return rc;
}

/*
 * Registry image -> squashfs, imported once per user and node: berth keeps
 * it in the user's image cache (on disk, pruned by the admin's timer) and
 * prints that file, which the start mounts as it is. --reuse: a step asks
 * the registry only when the node has no image of that URI yet (the import
 * of a moved tag is the user's call: berth import --cache-only URI).
 */
static int import_image(spank_t sp, char *sqsh)
{
	char uri[PATH_MAX], out[PATH_MAX + 1], notice[PATH_MAX + 64], headline[PATH_MAX + 64];
	char *argv[] = { conf.berth, "import", "--cache-only", "--reuse", uri, NULL };
	size_t len;

	if (image_uri(flags.image, uri, sizeof(uri)) < 0) {
		slurm_error("spank_berth: --container-image: '%s' is too long", flags.image);
		return -1;
	}
	if (conf.importer[0] != '\0')
		return import_with_importer(sp, uri, sqsh);
	/* pyxis's words, which users grep for, then the runtime's reason */
	snprintf(headline, sizeof(headline), "failed to import docker image: %s", uri);
	if (snprintf(notice, sizeof(notice), "importing %s into this node's image cache", uri) < 0 ||
	    run_cmd(sp, "berth import", argv, out, sizeof(out), notice, headline) < 0)
		return -1;
	len = strlen(out);
	if (len > 0 && out[len - 1] == '\n')
		out[--len] = '\0';
	if (out[0] != '/' || len >= PATH_MAX || strchr(out, '\n') != NULL) {
		slurm_error("spank_berth: %s", headline);
		slurm_error("spank_berth: berth import printed no path for %s", uri);
		return -1;
	}
	memcpy(sqsh, out, len + 1);
	return 0;
}

/* A path from the command line, relative to where srun ran. */
static int user_path(spank_t sp, const char *flag, const char *path, char *out)
{
	char pwd[PATH_MAX];

	if (path[0] == '/')
		return path_join(out, "%s", path);
	if (spank_getenv(sp, "PWD", pwd, sizeof(pwd)) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: %s: relative path '%s' and no PWD", flag, path);
		return -1;
	}
	return path_join(out, "%s/%s", pwd, path);
}

/* The squashfs file of --container-image, imported first for a registry image. */
static int resolve_image(spank_t sp, char *sqsh)
{
	if (image_is_file(flags.image))
		return user_path(sp, "--container-image", flags.image, sqsh);
	return import_image(sp, sqsh);
}

static int container_exists(spank_t sp, const char *name)
{
	char out[65536];
	char *argv[] = { conf.berth, "list", NULL };
	size_t len = strlen(name);

	if (run(sp, "berth list", argv, out, sizeof(out), NULL) < 0)
		return -1;
	for (char *line = out; *line != '\0'; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != '\0'))
		if (strncmp(line, name, len) == 0 && (line[len] == '\n' || line[len] == '\0'))
			return 1;
	return 0;
}

/* pid of a running container recorded in pidfile, or 0. */
static pid_t running_pid(const char *pidfile)
{
	char buf[32], proc[64];
	struct stat st;
	ssize_t n;
	long pid;
	int fd = open(pidfile, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	pid = strtol(buf, NULL, 10);
	snprintf(proc, sizeof(proc), "/proc/%ld", pid);
	if (pid <= 0 || stat(proc, &st) < 0 || st.st_uid != step.uid)
		return 0;
	return (pid_t)pid;
}

static int write_pidfile(const char *pidfile, pid_t pid)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%ld\n", (long)pid);
	int fd = open(pidfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0 || write(fd, buf, (size_t)n) != n) {
		slurm_error("spank_berth: cannot write %s: %m", pidfile);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/*
 * The step's PMIx server dir (PMIX_SERVER_TMPDIR of the tasks). Slurm puts
 * that variable only into each task's env, after the container starts; but
 * its PMIx server, running in this slurmstepd, already maps files below
 * <base>/pmix.<jobid>.<stepid>/, whatever base slurm.conf or mpi.conf chose.
 * 0: found, -1: not a PMIx step.
 */
static int find_pmix_dir(spank_t sp, char *dir)
{
	char component[64], line[PATH_MAX + 256];
	struct stat st;
	FILE *maps;
	int found = -1;

	if (spank_getenv(sp, "PMIX_SERVER_TMPDIR", dir, PATH_MAX) == ESPANK_SUCCESS)
		return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
	snprintf(component, sizeof(component), "/pmix.%u.%u/", step.jobid, step.stepid);
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

/*
 * slurmstepd execs the batch script from its spool dir (argv[0]) after
 * task_init, by then inside the container: "DIR:DIR" of that dir, or "" for
 * other steps. -1 (logged) when the batch step has no script path.
 */
static int batch_script_mount(spank_t sp, char *out, size_t outlen)
{
	char **argv = NULL;
	const char *slash;
	int argc = 0, n;

	out[0] = '\0';
	if (step.stepid != SLURM_BATCH_SCRIPT)
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

static void set_override(char **env, int *n, char *storage, const char *key, enum tristate value)
{
	if (value == UNSET)
		return;
	sprintf(storage, "%s=%s", key, value == ON ? "yes" : "no");
	env[(*n)++] = storage;
}

/* "berth start --detach ... TARGET": wait for the pid line; report: log a failure. */
static int start_keeper(spank_t sp, const char *target, int report)
{
	char log_path[PATH_MAX], pmix_dir[PATH_MAX], pmix_mount[2 * PATH_MAX + 2];
	char script_mount[2 * PATH_MAX + 2];
	char home[64], remap[64], writable[64];
	char **overrides = NULL;
	int noverrides = 0;
	char *mounts = NULL, *env_set = NULL, *hook_env = NULL, **argv = NULL, **env = NULL;
	char **mount_args = NULL;
	size_t nmount_args = 0;
	int in_pipe[2] = { -1, -1 }, out_pipe[2] = { -1, -1 };
	char line[32];
	size_t used = 0;
	int argc = 0, rc = -1, status;
	size_t nmounts = 1, nenv = 1, nhooks = 1;

	for (const char *p = flags.mounts; p && *p; p++)
		nmounts += *p == ',';
	for (const char *p = flags.env_set; p && *p; p++)
		nenv += *p == '\n';
	for (const char *p = flags.hook_env; p && *p; p++)
		nhooks += *p == '\n';
	argv = calloc(2 * nmounts + 2 * nenv + 15, sizeof(*argv));
	overrides = calloc(nhooks + 3, sizeof(*overrides));
	mount_args = calloc(nmounts, sizeof(*mount_args));
	if (argv == NULL || overrides == NULL || mount_args == NULL ||
	    (flags.mounts && (mounts = strdup(flags.mounts)) == NULL) ||
	    (flags.env_set && (env_set = strdup(flags.env_set)) == NULL) ||
	    (flags.hook_env && (hook_env = strdup(flags.hook_env)) == NULL)) {
		slurm_error("spank_berth: out of memory");
		goto out;
	}
	set_override(overrides, &noverrides, home, "ENROOT_MOUNT_HOME", flags.mount_home);
	set_override(overrides, &noverrides, remap, "ENROOT_REMAP_ROOT", flags.remap_root);
	set_override(overrides, &noverrides, writable, "ENROOT_ROOTFS_WRITABLE", flags.writable);
	/* hooks run in the caller's environment: the EDF's annotations go there */
	for (char *save = NULL, *e = hook_env ? strtok_r(hook_env, "\n", &save) : NULL; e;
	     e = strtok_r(NULL, "\n", &save))
		overrides[noverrides++] = e;
	argv[argc++] = conf.berth;
	argv[argc++] = "start";
	argv[argc++] = "--detach";
	if (flags.entrypoint != UNSET ? flags.entrypoint == ON : conf.execute_entrypoint)
		argv[argc++] = "--entrypoint";
	for (const char *const *ns = (const char *const[]){ "net", "ipc", "uts", NULL }; *ns; ns++)
		if (unshare_has(&flags, *ns))
			argv[argc++] = strcmp(*ns, "net") == 0 ? "--net" :
				       strcmp(*ns, "ipc") == 0 ? "--ipc" : "--uts";
	for (char *save = NULL, *m = mounts ? strtok_r(mounts, ",", &save) : NULL; m;
	     m = strtok_r(NULL, ",", &save)) {
		char *arg = mount_arg(sp, m);

		if (arg == NULL)
			goto out;
		mount_args[nmount_args++] = arg;
		argv[argc++] = "-m";
		argv[argc++] = arg;
	}
	/* --environment's env: the container's, over its image's */
	for (char *save = NULL, *e = env_set ? strtok_r(env_set, "\n", &save) : NULL; e;
	     e = strtok_r(NULL, "\n", &save)) {
		argv[argc++] = "-e";
		argv[argc++] = e;
	}
	/* PMIx clients find their server through this dir: same path inside. */
	if (find_pmix_dir(sp, pmix_dir) == 0) {
		snprintf(pmix_mount, sizeof(pmix_mount), "%s:%s", pmix_dir, pmix_dir);
		argv[argc++] = "-m";
		argv[argc++] = pmix_mount;
	}
	if (batch_script_mount(sp, script_mount, sizeof(script_mount)) < 0)
		goto out;
	if (script_mount[0] != '\0') {
		argv[argc++] = "-m";
		argv[argc++] = script_mount;
	}
	argv[argc++] = (char *)target;
	if (path_join(log_path, "%s/start.log", step.step_dir) < 0)
		goto out;
	env = child_env(sp, overrides, noverrides);
	if (env == NULL)
		goto out;
	if (pipe2(in_pipe, O_CLOEXEC) < 0 || pipe2(out_pipe, O_CLOEXEC) < 0) {
		slurm_error("spank_berth: pipe: %m");
		goto out;
	}
	status = spawn(sp, argv, env, in_pipe[0], out_pipe[1], log_path, &step.keeper);
	close(in_pipe[0]);
	close(out_pipe[1]);
	in_pipe[0] = out_pipe[1] = -1;
	if (status < 0)
		goto out;
	step.keeper_stdin = in_pipe[1];
	in_pipe[1] = -1;
	while (used < sizeof(line) - 1) {
		ssize_t n = read(out_pipe[0], line + used, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || line[used] == '\n')
			break;
		used++;
	}
	line[used] = '\0';
	step.container_pid = (pid_t)strtol(line, NULL, 10);
	if (used == 0 || step.container_pid <= 0 || strspn(line, "0123456789") != used) {
		step.container_pid = 0;
		close(step.keeper_stdin);
		step.keeper_stdin = -1;
		if (child_wait(&step.keeper, -1, "berth start", 0, &status) < 0)
			status = -1;
		if (report)
			report_failure("berth start", log_path, status, NULL);
		goto out;
	}
	rc = 0;
out:
	for (int i = 0; i < 2; i++) {
		if (in_pipe[i] >= 0)
			close(in_pipe[i]);
		if (out_pipe[i] >= 0)
			close(out_pipe[i]);
	}
	free(env);
	free(argv);
	for (size_t i = 0; i < nmount_args; i++)
		free(mount_args[i]);
	free(mount_args);
	free(mounts);
	free(env_set);
	free(hook_env);
	free(overrides);
	return rc;
}

/*
 * Attaching with --container-unshare=NS: the running container must have
 * its own NS, or the task would share the host's while asking not to.
 */
static int attach_has_namespaces(pid_t pid)
{
	static const char *const names[] = { "net", "ipc", "uts" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char theirs_path[64], ours_path[64];
		struct stat theirs, ours;

		if (!unshare_has(&flags, names[i]))
			continue;
		snprintf(theirs_path, sizeof(theirs_path), "/proc/%ld/ns/%s", (long)pid, names[i]);
		snprintf(ours_path, sizeof(ours_path), "/proc/self/ns/%s", names[i]);
		if (stat(theirs_path, &theirs) < 0 || stat(ours_path, &ours) < 0) {
			slurm_error("spank_berth: cannot compare the %s namespaces: %m", names[i]);
			return -1;
		}
		if (theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev) {
			slurm_error("spank_berth: --container-unshare=%s: the running container '%s' "
				    "has no %s namespace of its own (start it with --container-unshare=%s)",
				    names[i], flags.name, names[i], names[i]);
			return -1;
		}
	}
	return 0;
}

/* --container-name: attach to it running, or create it once and start it. */
static int prepare_named(spank_t sp)
{
	char named[PATH_MAX], lock[PATH_MAX], pidfile[PATH_MAX], sqsh[PATH_MAX];
	int lock_fd, exists, rc = -1;
	pid_t running;
	char *argv[] = { conf.berth, "create", "-n", step.container, sqsh, NULL };

	if (path_join(named, "%s/named", step.state_dir) < 0 ||
	    make_dir(named, 0700, step.uid, step.gid) < 0 ||
	    path_join(lock, "%s/%s.lock", named, step.container) < 0 ||
	    path_join(pidfile, "%s/%s.pid", named, step.container) < 0)
		return -1;
	lock_fd = lock_file(lock);
	if (lock_fd < 0)
		return -1;
	running = running_pid(pidfile);
	if (flags.name_mode == NAME_EXEC || (flags.name_mode == NAME_AUTO && running)) {
		if (running == 0) {
			slurm_error("spank_berth: --container-name: '%s' is not running on this node",
				    flags.name);
			goto out;
		}
		if (attach_has_namespaces(running) < 0)
			goto out;
		step.container_pid = running;
		if (flags.mounts != NULL)
			slurm_spank_log("spank_berth: warning: --container-mounts ignored: attaching "
					"to the running container '%s', whose mounts are made", flags.name);
		rc = 0;
		goto out;
	}
	/*
	 * Most steps find their container on disk: start it straight away, and
	 * pay for "berth list" only when that fails (or to refuse mode create).
	 */
	if (flags.name_mode != NAME_CREATE && start_keeper(sp, step.container, 0) == 0)
		goto started;
	exists = container_exists(sp, step.container);
	if (exists < 0)
		goto out;
	if (exists && flags.name_mode == NAME_CREATE) {
		slurm_error("spank_berth: --container-name: '%s' exists already (mode create)",
			    flags.name);
		goto out;
	}
	if (!exists && flags.image == NULL) {
		slurm_error("spank_berth: --container-name: no container '%s' on this node "
			    "and no --container-image to create it from", flags.name);
		goto out;
	}
	if (!exists && (resolve_image(sp, sqsh) < 0 ||
			run(sp, "berth create", argv, NULL, 0, NULL) < 0))
		goto out;
	if (start_keeper(sp, step.container, 1) < 0) /* again if it existed: now say why */
		goto out;
started:
	if (running == 0) {
		if (write_pidfile(pidfile, step.container_pid) < 0)
			goto out;
		strcpy(step.pidfile, pidfile);
	}
	rc = 0;
out:
	close(lock_fd);
	return rc;
}

/* "JOBID.STEPID" or "JOBID.batch": the name of an unnamed step's container. */
static int is_step_label(const char *name)
{
	size_t jobid = strspn(name, "0123456789");
	const char *stepid = name + jobid + 1;

	return jobid > 0 && name[jobid] == '.' &&
	       (strcmp(stepid, "batch") == 0 ||
		(*stepid != '\0' && stepid[strspn(stepid, "0123456789")] == '\0'));
}

/*
 * An unnamed step's running container is recorded as <prefix>_JOBID.STEPID,
 * so that --container-name=JOBID.STEPID attaches to it (as pyxis names it).
 */
static int record_unnamed(void)
{
	char named[PATH_MAX], pidfile[PATH_MAX];

	if (path_join(named, "%s/named", step.state_dir) < 0 ||
	    make_dir(named, 0700, step.uid, step.gid) < 0 ||
	    path_join(pidfile, "%s/%s_%s.pid", named, conf.container_prefix, step.label) < 0 ||
	    write_pidfile(pidfile, step.container_pid) < 0)
		return -1;
	strcpy(step.pidfile, pidfile);
	return 0;
}

/* Import, create and start this step's container; -1 (logged) on failure. */
static int setup_container(spank_t sp)
{
	char sqsh[PATH_MAX];
	char *create_argv[] = { conf.berth, "create", "-n", step.container, sqsh, NULL };
	int n;

	if (make_dir(step.state_dir, 0700, step.uid, step.gid) < 0 ||
	    make_dir(step.step_dir, 0700, step.uid, step.gid) < 0)
		return -1;
	if (flags.name != NULL) {
		/* a step's container is the job's already: no job scope prefix */
		n = conf.container_scope_job && !is_step_label(flags.name)
			? snprintf(step.container, sizeof(step.container), "%s_%u_%s",
				   conf.container_prefix, step.jobid, flags.name)
			: snprintf(step.container, sizeof(step.container), "%s_%s",
				   conf.container_prefix, flags.name);
		if (n < 0 || (size_t)n >= sizeof(step.container)) {
			slurm_error("spank_berth: --container-name: '%s' is too long", flags.name);
			return -1;
		}
		return prepare_named(sp);
	}
	if (resolve_image(sp, sqsh) < 0)
		return -1;
	if (flags.save == NULL)
		return start_keeper(sp, sqsh, 1) < 0 ? -1 : record_unnamed();
	/* Saving needs a container on disk; a mounted image leaves nothing to save. */
	snprintf(step.container, sizeof(step.container), "%s_%s", conf.container_prefix,
		 step.label);
	if (run(sp, "berth create", create_argv, NULL, 0, NULL) < 0)
		return -1;
	step.remove_container = 1;
	return start_keeper(sp, step.container, 1) < 0 ? -1 : record_unnamed();
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!step.active)
		return 0;
	/*
	 * A failure here makes Slurm 22.05 report "launch failed" yet srun exit 0.
	 * Failing every task instead gives srun a non-zero exit status.
	 */
	if (setup_container(sp) < 0)
		step.setup_failed = 1;
	return 0;
}

/* ---- task side ------------------------------------------------------------- */

/* The NUL-separated environment of pid, NUL-terminated twice; NULL on error. */
static char *read_environ(pid_t pid, size_t *len)
{
	char path[64];
	size_t cap = 16384, used = 0;
	char *buf = malloc(cap);
	int fd;

	snprintf(path, sizeof(path), "/proc/%ld/environ", (long)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (buf == NULL || fd < 0) {
		slurm_error("spank_berth: cannot read %s: %m", path);
		free(buf);
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	for (;;) {
		ssize_t n;

		if (cap - used < 2) {
			char *bigger = realloc(buf, cap * 2);

			if (bigger == NULL) {
				slurm_error("spank_berth: out of memory");
				free(buf);
				close(fd);
				return NULL;
			}
			buf = bigger;
			cap *= 2;
		}
		n = read(fd, buf + used, cap - used - 2);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			slurm_error("spank_berth: cannot read %s: %m", path);
			free(buf);
			close(fd);
			return NULL;
		}
		if (n == 0)
			break;
		used += (size_t)n;
	}
	close(fd);
	buf[used] = buf[used + 1] = '\0';
	*len = used;
	return buf;
}

static int task_has(spank_t sp, const char *key)
{
	char small[2];

	return spank_getenv(sp, key, small, sizeof(small)) != ESPANK_ENV_NOEXIST;
}

static int set_env(spank_t sp, const char *key, const char *value)
{
	if (spank_setenv(sp, key, value, 1) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: cannot set %s in the task environment", key);
		return -1;
	}
	return 0;
}

/* What the EDF sets beats the task's values (as a flag would). */
static int set_edf_env(spank_t sp)
{
	char *copy = strdup(flags.env_set);
	int rc = 0;

	if (copy == NULL) {
		slurm_error("spank_berth: out of memory");
		return -1;
	}
	for (char *save = NULL, *e = strtok_r(copy, "\n", &save); e && rc == 0;
	     e = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(e, '=');

		if (eq == NULL) /* apply_edf took only KEY=VALUE lines */
			continue;
		*eq = '\0';
		rc = set_env(sp, e, eq + 1);
	}
	free(copy);
	return rc;
}

/* Container env into the task env by the rules in container_value_wins(). */
static int merge_environment(spank_t sp)
{
	static const char *const pmix_mca[][2] = {
		{ "PMIX_PTL_MODULE", "PMIX_MCA_ptl" },
		{ "PMIX_SECURITY_MODE", "PMIX_MCA_psec" },
		{ "PMIX_GDS_MODULE", "PMIX_MCA_gds" },
	};
	char value[4096];
	size_t len;
	char *env = read_environ(step.container_pid, &len);
	int rc = 0;

	if (env == NULL)
		return -1;
	/* a locale of the submitting host the image may lack: gone unless asked for */
	for (const char *const *key = (const char *const[]){ "LANG", "LANGUAGE", "LC_ALL", NULL };
	     *key != NULL && rc == 0; key++)
		if (task_value_dropped(*key, strlen(*key), flags.env_names) && task_has(sp, *key) &&
		    spank_unsetenv(sp, *key) != ESPANK_SUCCESS) {
			slurm_error("spank_berth: cannot unset %s in the task environment", *key);
			rc = -1;
		}
	for (char *entry = env; *entry != '\0' && rc == 0; entry += strlen(entry) + 1) {
		char *eq = strchr(entry, '=');

		if (eq == NULL || eq == entry)
			continue;
		*eq = '\0';
		if (container_value_wins(entry, (size_t)(eq - entry), task_has(sp, entry),
					 flags.env_names))
			rc = set_env(sp, entry, eq + 1);
		entry[strlen(entry)] = '=';
	}
	free(env);
	/* PMIx inside the image reads the PMIX_MCA_* spelling of these. */
	for (size_t i = 0; i < sizeof(pmix_mca) / sizeof(pmix_mca[0]) && rc == 0; i++)
		if (!task_has(sp, pmix_mca[i][1]) &&
		    spank_getenv(sp, pmix_mca[i][0], value, sizeof(value)) == ESPANK_SUCCESS)
			rc = set_env(sp, pmix_mca[i][1], value);
	if (rc == 0)
		rc = set_env(sp, "BERTH_VERSION", BERTH_SPANK_VERSION);
	if (rc == 0 && flags.env_set != NULL)
		rc = set_edf_env(sp);
	return rc;
}

static const struct { const char *name; int type; } namespaces[] = {
	{ "user", CLONE_NEWUSER }, /* first: it gives the rights to join the rest */
	{ "mnt", CLONE_NEWNS },
	{ "net", CLONE_NEWNET },
	{ "ipc", CLONE_NEWIPC },
	{ "uts", CLONE_NEWUTS },
};
#define NS_COUNT (sizeof(namespaces) / sizeof(namespaces[0]))

/*
 * Join the container's namespaces that differ from the task's. All are
 * compared before the first setns: afterwards the task has no rights in
 * the namespaces it shares with the host.
 */
static int join_namespaces(void)
{
	int fds[NS_COUNT];
	int rc = 0;

	for (size_t i = 0; i < NS_COUNT; i++) {
		char path[64], self[64];
		struct stat target, mine;

		snprintf(path, sizeof(path), "/proc/%ld/ns/%s", (long)step.container_pid,
			 namespaces[i].name);
		snprintf(self, sizeof(self), "/proc/self/ns/%s", namespaces[i].name);
		fds[i] = open(path, O_RDONLY | O_CLOEXEC);
		if (fds[i] < 0 || fstat(fds[i], &target) < 0 || stat(self, &mine) < 0) {
			slurm_error("spank_berth: cannot open %s: %m", path);
			rc = -1;
		} else if (target.st_ino == mine.st_ino && target.st_dev == mine.st_dev) {
			close(fds[i]);
			fds[i] = -1;
		}
	}
	for (size_t i = 0; i < NS_COUNT; i++) {
		if (rc == 0 && fds[i] >= 0 && setns(fds[i], namespaces[i].type) < 0) {
			slurm_error("spank_berth: cannot join the container's %s namespace: %m",
				    namespaces[i].name);
			rc = -1;
		}
		if (fds[i] >= 0)
			close(fds[i]);
	}
	return rc;
}

static int same_dir(int fd, const char *path)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && stat(path, &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* setns into the container, then chroot to its root and pick the cwd. */
static int enter_container(void)
{
	char root_path[64], cwd_path[64], orig[PATH_MAX];
	int have_orig = getcwd(orig, sizeof(orig)) != NULL;
	int root_fd, cwd_fd, rc = -1;

	/* Opened before setns: afterwards /proc may not be mounted. */
	snprintf(root_path, sizeof(root_path), "/proc/%ld/root", (long)step.container_pid);
	snprintf(cwd_path, sizeof(cwd_path), "/proc/%ld/cwd", (long)step.container_pid);
	root_fd = open(root_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cwd_fd = open(cwd_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || cwd_fd < 0) {
		slurm_error("spank_berth: cannot open %s: %m", root_fd < 0 ? root_path : cwd_path);
		goto out;
	}
	if (join_namespaces() < 0)
		goto out;
	if (fchdir(root_fd) < 0 || chroot(".") < 0) {
		slurm_error("spank_berth: cannot enter the container root: %m");
		goto out;
	}
	if (flags.workdir != NULL) {
		/* a relative one from the container's '/' ("../" there is '/') */
		if ((flags.workdir[0] != '/' && chdir("/") < 0) || chdir(flags.workdir) < 0) {
			slurm_error("spank_berth: --container-workdir: cannot chdir to %s: %m",
				    flags.workdir);
			goto out;
		}
	} else if (!same_dir(cwd_fd, "/")) {
		/* the image's working directory */
		if (fchdir(cwd_fd) < 0) {
			slurm_error("spank_berth: cannot chdir to the container's workdir: %m");
			goto out;
		}
	} else if (!(have_orig && chdir(orig) == 0) && chdir("/") < 0) {
		slurm_error("spank_berth: cannot chdir to / in the container: %m");
		goto out;
	}
	rc = 0;
out:
	if (root_fd >= 0)
		close(root_fd);
	if (cwd_fd >= 0)
		close(cwd_fd);
	return rc;
}

/* --container-entrypoint-log: what the start printed, once per node, on the step's stderr. */
static void show_start_log(spank_t sp)
{
	char log_path[PATH_MAX], buf[4096];
	ssize_t n;
	int task, fd;

	if (!flags.entrypoint_log || step.keeper.pidfd < 0 ||
	    spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task != 0 ||
	    path_join(log_path, "%s/start.log", step.step_dir) < 0)
		return;
	/* task_init runs in the task, as the user; never read the user's tree as root */
	if (getuid() == 0 || geteuid() == 0) {
		slurm_error("spank_berth: --container-entrypoint-log: not shown (running as root)");
		return;
	}
	fd = open(log_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		slurm_error("spank_berth: --container-entrypoint-log: %s: %m", log_path);
		return;
	}
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		if (write(STDERR_FILENO, buf, (size_t)n) != n)
			break;
	close(fd);
}

/*
 * The runtime's seccomp filter (chown, setuid and friends succeed without
 * effect, as for a fake root): the keeper's children have it, a task that
 * joined by setns must install it itself. No-op where the runtime has none.
 */
static int install_seccomp_filter(void)
{
#ifdef BERTH_HAVE_SECCOMP_FILTER
	struct sock_fprog program = {
		.len = (unsigned short)(sizeof(seccomp_filter) / sizeof(seccomp_filter[0])),
		.filter = (struct sock_filter *)seccomp_filter,
	};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) < 0) {
		slurm_error("spank_berth: cannot install the container's seccomp filter: %m");
		return -1;
	}
#endif
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (step.active && step.setup_failed) {
		slurm_error("spank_berth: no container for this task (see the error above)");
		return -1;
	}
	if (!step.active || step.container_pid <= 0)
		return 0;
	show_start_log(sp); /* before the host's paths are out of sight */
	if (merge_environment(sp) < 0 || enter_container() < 0 || install_seccomp_filter() < 0)
		return -1;
	return 0;
}

/* ---- step end --------------------------------------------------------------- */

/* EOF on its stdin tells the keeper to tear down; signals (by pidfd) if it does not. */
static void stop_keeper(void)
{
	if (step.keeper_stdin >= 0)
		close(step.keeper_stdin);
	step.keeper_stdin = -1;
	if (step.keeper.pidfd < 0)
		return;
	if (!child_exited(&step.keeper, 10000)) {
		slurm_info("spank_berth: container keeper %ld ignored EOF, sending SIGTERM",
			   (long)step.keeper.pid);
		child_signal(&step.keeper, SIGTERM);
		if (!child_exited(&step.keeper, 5000)) {
			child_signal(&step.keeper, SIGKILL);
			child_exited(&step.keeper, 5000);
		}
	}
	child_release(&step.keeper);
}

/*
 * In a child that is the user (the tree is the user's, and any part of it
 * may be a link the user put there): unlink the named container's pid file
 * we wrote, and with_dir, the step dir's files and the dir. Exits 0, or
 * with the errno of what failed.
 */
static void remove_user_files_child(int with_dir)
{
	char entries[4096] __attribute__((aligned(8)));
	int failed = 0, fd;
	ssize_t n;

	if (step.pidfile[0] != '\0' && unlink(step.pidfile) < 0 && errno != ENOENT)
		failed = errno;
	if (!with_dir)
		_exit(failed);
	fd = open(step.step_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && (errno == ELOOP || errno == ENOTDIR))
		_exit(unlink(step.step_dir) == 0 ? 0 : errno); /* the link, not what it names */
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
	_exit(rmdir(step.step_dir) == 0 ? failed : errno);
}

/* The pid file and (with_dir) the step dir, removed by a child that is the user. */
static void remove_user_files(int with_dir)
{
	struct child remover;
	int oom_failed, status = 0;

	if (step.pidfile[0] == '\0' && !with_dir)
		return;
	switch (fork_user(&remover, &step.gid, 1, &oom_failed)) {
	case 0:
		remove_user_files_child(with_dir);
		_exit(1);
	case -1:
		return;
	}
	if (child_wait(&remover, now_ms() + 1000LL * conf.cleanup_timeout,
		       "removing the step's files as the user", conf.cleanup_timeout, &status) < 0)
		return;
	if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_NO_USER)
		slurm_error("spank_berth: cannot become uid %u to remove %s",
			    (unsigned)step.uid, step.step_dir);
	else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		slurm_info("spank_berth: cannot remove %s%s%s: %s", step.pidfile,
			   step.pidfile[0] && with_dir ? " or " : "", with_dir ? step.step_dir : "",
			   WIFEXITED(status) ? strerror(WEXITSTATUS(status)) : "killed");
}

/* Stop the container, save and remove what the step asked for, drop the logs. */
static int finish_step(spank_t sp)
{
	int rc = 0;

	stop_keeper();
	if (flags.save != NULL && step.container[0] != '\0') {
		char save[PATH_MAX];
		char *argv[] = { conf.berth, "export", "-f", "-o", save, step.container, NULL };

		rc = user_path(sp, "--container-save", flags.save, save);
		if (rc == 0)
			rc = run(sp, "berth export", argv, NULL, 0, NULL);
	}
	if (step.remove_container) {
		char *argv[] = { conf.berth, "remove", "-f", step.container, NULL };

		if (run(sp, "berth remove", argv, NULL, 0, NULL) < 0)
			rc = -1;
	}
	remove_user_files(rc == 0); /* on failure the logs stay for the admin */
	step.active = 0;
	return rc;
}

/*
 * After the last local task, while slurmstepd still waits: at slurm_spank_exit
 * Slurm is already signalling what is left of the step, export included.
 */
int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!step.active || step.tasks_left == 0 || --step.tasks_left > 0)
		return 0;
	return finish_step(sp);
}

/* container_scope=job: the job's named containers end with it (slurmd's epilog, as root). */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	char out[65536], prefix[CONTAINER_PREFIX_MAX + 16], steps[CONTAINER_PREFIX_MAX + 16];
	char *line, *save = NULL;
	char *list_argv[] = { conf.berth, "list", NULL };
	char err[ERR_LEN];
	int rc = 0;

	/* slurm_spank_init does not run before the epilog */
	if (conf_parse(&conf, ac, av, err, sizeof(err)) < 0) {
		slurm_error("spank_berth: plugstack.conf: %s", err);
		return -1;
	}
	if (!conf.container_scope_job)
		return 0;
	if (spank_get_item(sp, S_JOB_UID, &step.uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &step.gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &step.jobid) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: epilog: cannot read the job's uid, gid or id");
		return -1;
	}
	if (run(sp, "berth list", list_argv, out, sizeof(out), NULL) < 0)
		return -1;
	/* NAME, and JOBID.STEPID made by attaching to a step that was gone */
	snprintf(prefix, sizeof(prefix), "%s_%u_", conf.container_prefix, step.jobid);
	snprintf(steps, sizeof(steps), "%s_%u.", conf.container_prefix, step.jobid);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *remove_argv[] = { conf.berth, "remove", "-f", line, NULL };

		/* gone meanwhile (the user removed it): nothing left to do */
		if ((strncmp(line, prefix, strlen(prefix)) == 0 ||
		     strncmp(line, steps, strlen(steps)) == 0) &&
		    run(sp, "berth remove", remove_argv, NULL, 0, NULL) < 0 &&
		    container_exists(sp, line) != 0)
			rc = -1;
	}
	return rc;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	int rc = 0;

	(void)ac;
	(void)av;
	/* steps whose tasks never started */
	if (spank_context() == S_CTX_REMOTE && step.active)
		rc = finish_step(sp);
	flags_free(&flags);
	return rc;
}
