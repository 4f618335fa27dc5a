/* See submit.h. */
#define _GNU_SOURCE
#include "submit.h"
#include "edf.h"
#include "image_ref.h"
#include "pyxis_env.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * The EDF is resolved once, at submission (the submitting environment
 * expands its ${VAR}s), and its values reach the nodes in the job's
 * environment under this name: see edf_body() in edf.h. SLURM_* names
 * survive sbatch --export=NONE, so a containerized batch step finds it too.
 */
#define EDF_VAR "SLURM_BERTH_EDF"
#define EDF_MAX 65536

/*
 * A registry image's tag, resolved to its digest once at submission, the
 * same way: "URI\nPINNED" (image_pin() in image_ref.h). Every node of the
 * job imports PINNED, so a tag that moves meanwhile changes nothing, and
 * the next job sees where it points then.
 */
#define IMAGE_VAR "SLURM_BERTH_IMAGE"

static int wait_child(pid_t pid, int *status)
{
	while (waitpid(pid, status, 0) < 0) {
		if (errno != EINTR)
			return -1;
	}
	return 0;
}

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
 * Start argv as the submitting user in its environment, stdout and stderr
 * into c's pipes (collect with capture_finish). The child ends with this
 * process: a resolve left running by an srun that failed to allocate.
 */
static int capture_start(char *const argv[], struct capture *c, char *msg, size_t msglen)
{
	int out_pipe[2] = { -1, -1 }, err_pipe[2] = { -1, -1 };
	pid_t parent = getpid();

	c->pid = -1;
	if (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0) {
		snprintf(msg, msglen, "pipe: %s", strerror(errno));
		goto fail;
	}
	c->pid = fork();
	if (c->pid == 0) {
		int null_fd = open("/dev/null", O_RDONLY);

		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent || null_fd < 0 ||
		    dup2(null_fd, 0) < 0 || dup2(out_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0)
			_exit(126);
		execv(argv[0], argv);
		_exit(127);
	}
	if (c->pid < 0) {
		snprintf(msg, msglen, "fork: %s", strerror(errno));
		goto fail;
	}
	close(out_pipe[1]);
	close(err_pipe[1]);
	c->out_fd = out_pipe[0];
	c->err_fd = err_pipe[0];
	return 0;
fail:
	for (int i = 0; i < 2; i++) {
		if (out_pipe[i] >= 0)
			close(out_pipe[i]);
		if (err_pipe[i] >= 0)
			close(err_pipe[i]);
	}
	c->pid = -1;
	return -1;
}

/* A started capture not to be collected: its child killed and reaped. */
static void capture_cancel(struct capture *c)
{
	int status;

	if (c->pid <= 0)
		return;
	close(c->out_fd);
	close(c->err_fd);
	kill(c->pid, SIGKILL);
	wait_child(c->pid, &status);
	c->pid = -1;
}

/*
 * Collect a started capture of program: stdout into out (NUL terminated),
 * on failure the last stderr line into msg. 0: exit status 0.
 */
static int capture_finish(const char *program, struct capture *c, char *out, size_t outlen,
			  char *msg, size_t msglen)
{
	char errbuf[4096];
	size_t used = 0, errused = 0;
	int status = 0, overflow = 0, rc = -1;

	/* both pipes at once: a child blocked on a full one would never exit */
	for (struct pollfd fds[2] = { { c->out_fd, POLLIN, 0 }, { c->err_fd, POLLIN, 0 } };
	     fds[0].fd >= 0 || fds[1].fd >= 0;) {
		char sink[4096];
		ssize_t n;

		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			snprintf(msg, msglen, "poll: %s", strerror(errno));
			capture_cancel(c);
			return -1;
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
	close(c->out_fd);
	close(c->err_fd);
	if (wait_child(c->pid, &status) < 0)
		snprintf(msg, msglen, "waitpid: %s", strerror(errno));
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !overflow)
		rc = 0;
	else if (overflow)
		snprintf(msg, msglen, "%s printed more than %zu bytes", program, outlen - 1);
	else if (errused > 0)
		last_line(errbuf, errused, msg, msglen);
	else if (WIFEXITED(status) && WEXITSTATUS(status) >= 126)
		snprintf(msg, msglen, "cannot execute %s", program);
	else
		snprintf(msg, msglen, "%s failed with status %d", program, status);
	c->pid = -1;
	return rc;
}

/* Run argv as the submitting user and collect it (see capture_finish). */
static int capture(char *const argv[], char *out, size_t outlen, char *msg, size_t msglen)
{
	struct capture c;

	if (capture_start(argv, &c, msg, msglen) < 0)
		return -1;
	return capture_finish(argv[0], &c, out, outlen, msg, msglen);
}

/*
 * Resolve --environment through the runtime and put the result into this
 * process's environment, which srun/sbatch/salloc hand to the job. A job
 * step inside an sbatch/salloc of the same environment finds it there
 * already: resolved once, at the first submission.
 */
int submit_environment(const struct plugin_conf *conf, struct container_flags *flags)
{
	char *argv[] = { (char *)conf->berth, "edf", "show", "--spank", flags->environment, NULL };
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
	if (capture(argv, text + header, EDF_MAX - (size_t)header, msg, sizeof(msg)) < 0) {
		slurm_error("spank_berth: --environment: %s", msg);
		goto out;
	}
	if (apply_edf(flags, text + header, 1, err, sizeof(err)) < 0) {
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
int node_environment(spank_t sp, struct container_flags *flags)
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
		body = edf_body(text, flags->environment);
	if (body == NULL)
		slurm_error("spank_berth: --environment: '%s' resolved at submission did not reach "
			    "the node (%s: %s; does --export drop it?)", flags->environment, EDF_VAR,
			    got == ESPANK_SUCCESS ? "for another environment" : spank_strerror(got));
	else if (apply_edf(flags, body, 0, err, sizeof(err)) < 0)
		slurm_error("spank_berth: %s", err);
	else
		rc = 0;
	free(text);
	return rc;
}

/*
 * Resolve a registry --container-image to the digest its tag names now
 * ("berth import --resolve URI": one manifest request, as the user) and put
 * "URI\nPINNED" into this process's environment, which srun/sbatch/salloc
 * hand to the job. A step inside an sbatch/salloc of the same image finds
 * it there already: resolved once per job. Best effort: when the registry
 * cannot be asked from here, one line says so and the nodes import the tag
 * as they find it, as without this. Started here, collected by
 * submit_image_finish: srun collects it after its allocation is granted,
 * so that the request and the allocation overlap.
 */
void submit_image_start(const struct plugin_conf *conf, const struct container_flags *flags,
			struct image_resolve *resolve)
{
	char *argv[] = { (char *)conf->berth, "import", "--resolve", resolve->uri, NULL };
	const char *inherited = getenv(IMAGE_VAR);
	char msg[ERR_LEN];

	submit_image_finish(conf, resolve); /* one still pending: collected first */
	/* files and archives have no tag; a plugstack importer= imports by name */
	if (flags->image == NULL || conf->importer[0] != '\0' || image_is_file(flags->image) ||
	    image_archive_prefix(flags->image) > 0 ||
	    image_uri(flags->image, resolve->uri, sizeof(resolve->uri)) < 0 ||
	    strncmp(resolve->uri, "docker://", 9) != 0)
		return;
	if (inherited != NULL && image_pin(inherited, resolve->uri) != NULL)
		return;
	/* named by its digest already: the nodes import that, with nothing to ask */
	if (strstr(resolve->uri, "@sha256:") != NULL)
		return;
	if (capture_start(argv, &resolve->child, msg, sizeof(msg)) < 0)
		slurm_spank_log("spank_berth: warning: cannot resolve %s to a digest here (%s); "
				"each node imports the tag as it finds it then", resolve->uri, msg);
}

void submit_image_finish(const struct plugin_conf *conf, struct image_resolve *resolve)
{
	char pinned[PATH_MAX], msg[ERR_LEN];
	const char *uri = resolve->uri;
	char *text = NULL;
	size_t len;

	if (resolve->child.pid <= 0)
		return;
	if (capture_finish(conf->berth, &resolve->child, pinned, sizeof(pinned), msg,
			   sizeof(msg)) < 0) {
		slurm_spank_log("spank_berth: warning: cannot resolve %s to a digest here (%s); "
				"each node imports the tag as it finds it then", uri, msg);
		return;
	}
	len = strlen(pinned);
	if (len > 0 && pinned[len - 1] == '\n')
		pinned[--len] = '\0';
	text = malloc(strlen(uri) + len + 2);
	if (text == NULL) {
		slurm_error("spank_berth: out of memory");
		return;
	}
	snprintf(text, strlen(uri) + len + 2, "%s\n%s", uri, pinned);
	if (image_pin(text, uri) == NULL)
		slurm_spank_log("spank_berth: warning: %s import --resolve %s printed no pinned "
				"URI; each node imports the tag as it finds it then", conf->berth, uri);
	else if (setenv(IMAGE_VAR, text, 1) < 0)
		slurm_spank_log("spank_berth: warning: cannot set %s: %m", IMAGE_VAR);
	free(text);
}

void submit_image_cancel(struct image_resolve *resolve)
{
	capture_cancel(&resolve->child);
}

/* On the node: the URI this step's image was pinned to at submission, if any. */
int node_image(spank_t sp, const char *uri, char *pinned, size_t len)
{
	char text[PATH_MAX * 2 + 2];
	const char *pin;

	if (spank_getenv(sp, IMAGE_VAR, text, sizeof(text)) != ESPANK_SUCCESS)
		return 0;
	pin = image_pin(text, uri);
	if (pin == NULL || strlen(pin) >= len)
		return 0;
	memcpy(pinned, pin, strlen(pin) + 1);
	return 1;
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
