/* See task.h. */
#define _GNU_SOURCE
#include "task.h"
#include "env_merge.h"
#include "paths.h"
#include "seccomp_filter.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

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
static int set_edf_env(spank_t sp, const struct container_flags *flags)
{
	char *copy = strdup(flags->env_set);
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
static int merge_environment(spank_t sp, const struct step *st,
			     const struct container_flags *flags)
{
	static const char *const pmix_mca[][2] = {
		{ "PMIX_PTL_MODULE", "PMIX_MCA_ptl" },
		{ "PMIX_SECURITY_MODE", "PMIX_MCA_psec" },
		{ "PMIX_GDS_MODULE", "PMIX_MCA_gds" },
	};
	char value[4096];
	size_t len;
	char *env = read_environ(st->container_pid, &len);
	int rc = 0;

	if (env == NULL)
		return -1;
	/* a locale of the submitting host the image may lack: gone unless asked for */
	for (const char *const *key = (const char *const[]){ "LANG", "LANGUAGE", "LC_ALL", NULL };
	     *key != NULL && rc == 0; key++)
		if (task_value_dropped(*key, strlen(*key), flags->env_names) && task_has(sp, *key) &&
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
					 flags->env_names))
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
	if (rc == 0 && flags->env_set != NULL)
		rc = set_edf_env(sp, flags);
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
 * Join the namespaces of pid (the container's) that differ from the
 * task's. All are compared before the first setns: afterwards the task has
 * no rights in the namespaces it shares with the host.
 */
static int join_namespaces(pid_t pid)
{
	int fds[NS_COUNT];
	int rc = 0;

	for (size_t i = 0; i < NS_COUNT; i++) {
		char path[64], self[64];
		struct stat target, mine;

		snprintf(path, sizeof(path), "/proc/%ld/ns/%s", (long)pid,
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
static int enter_container(const struct step *st, const struct container_flags *flags)
{
	char root_path[64], cwd_path[64], orig[PATH_MAX];
	int have_orig = getcwd(orig, sizeof(orig)) != NULL;
	int root_fd, cwd_fd, rc = -1;

	/* Opened before setns: afterwards /proc may not be mounted. */
	snprintf(root_path, sizeof(root_path), "/proc/%ld/root", (long)st->container_pid);
	snprintf(cwd_path, sizeof(cwd_path), "/proc/%ld/cwd", (long)st->container_pid);
	root_fd = open(root_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cwd_fd = open(cwd_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || cwd_fd < 0) {
		slurm_error("spank_berth: cannot open %s: %m", root_fd < 0 ? root_path : cwd_path);
		goto out;
	}
	if (join_namespaces(st->container_pid) < 0)
		goto out;
	if (fchdir(root_fd) < 0 || chroot(".") < 0) {
		slurm_error("spank_berth: cannot enter the container root: %m");
		goto out;
	}
	if (flags->workdir != NULL) {
		/* a relative one from the container's '/' ("../" there is '/') */
		if ((flags->workdir[0] != '/' && chdir("/") < 0) || chdir(flags->workdir) < 0) {
			slurm_error("spank_berth: --container-workdir: cannot chdir to %s: %m",
				    flags->workdir);
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
static void show_start_log(spank_t sp, const struct step *st,
			   const struct container_flags *flags)
{
	char log_path[PATH_MAX], buf[4096];
	ssize_t n;
	int task, fd;

	if (!flags->entrypoint_log || st->keeper.pidfd < 0 ||
	    spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task != 0 ||
	    path_join(log_path, "%s/start.log", st->step_dir) < 0)
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


int task_join(spank_t sp, const struct step *st, const struct container_flags *flags)
{
	show_start_log(sp, st, flags); /* before the host's paths are out of sight */
	if (merge_environment(sp, st, flags) < 0 || enter_container(st, flags) < 0 ||
	    install_seccomp_filter() < 0)
		return -1;
	return 0;
}
