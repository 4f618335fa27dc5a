/* See container.h. */
#define _GNU_SOURCE
#include "container.h"
#include "answer.h"
#include "berth_cmd.h"
#include "edf.h"
#include "image_ref.h"
#include "keeper.h"
#include "paths.h"
#include "submit.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>

/*
 * Steps that never run in a container: the extern and interactive steps.
 * The batch step does when sbatch was given container flags, as with pyxis.
 */
static int special_step(const struct plugin_conf *conf, uint32_t stepid)
{
	return stepid == SLURM_EXTERN_CONT || stepid == SLURM_INTERACTIVE_STEP ||
	       (stepid == SLURM_BATCH_SCRIPT && !conf->sbatch_support);
}

/* "JOBID.STEPID" as scontrol writes it ("batch" for the batch step). */
static int step_label(char *out, size_t outlen, uint32_t jobid, uint32_t stepid)
{
	int n = stepid == SLURM_BATCH_SCRIPT ? snprintf(out, outlen, "%u.batch", jobid)
					     : snprintf(out, outlen, "%u.%u", jobid, stepid);

	return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

/* --environment: the values resolved at submission (submit.h), from the job's environment. */
static int node_environment(spank_t sp, struct container_flags *flags)
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

int step_init(spank_t sp, struct step *st, const struct plugin_conf *conf,
	      struct container_flags *flags)
{
	if (spank_get_item(sp, S_JOB_UID, &st->uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &st->gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_ID, &st->jobid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &st->stepid) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: cannot read the job's uid, gid or ids");
		return -1;
	}
	if (special_step(conf, st->stepid))
		return 0;
	if (flags->environment != NULL && node_environment(sp, flags) < 0)
		return -1;
	/* runtime_path is root's; the per-user dir below it is the user's (pyxis#4). */
	if (step_label(st->label, sizeof(st->label), st->jobid, st->stepid) < 0 ||
	    make_dir(conf->runtime_path, 0755, 0, 0) < 0 ||
	    path_join(st->user_dir, "%s/%u", conf->runtime_path, (unsigned)st->uid) < 0 ||
	    make_dir(st->user_dir, 0700, st->uid, st->gid) < 0 ||
	    path_join(st->state_dir, "%s/spank", st->user_dir) < 0 ||
	    path_join(st->step_dir, "%s/%s", st->state_dir, st->label) < 0)
		return -1;
	if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &st->tasks_left) != ESPANK_SUCCESS) {
		slurm_error("spank_berth: cannot read the step's task count");
		return -1;
	}
	st->active = 1;
	return 0;
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

/*
 * One line per step and node in slurmd's log, so that an admin can answer
 * "which image did job N run?" after the fact (the tag a user named may
 * have moved since): the image as given, and the digest the runtime, as
 * the user, says it was pulled by.
 */
static void log_image(const struct step *st, const char *image, const char *digest)
{
	slurm_info("spank_berth: step %s of uid %u runs image %s digest %s", st->label,
		   (unsigned int)st->uid, image, digest);
}

/* A custom importer's copy of req->uri in state_dir/images, made once per node. */
static int import_with_importer(spank_t sp, const struct step *st, const struct plugin_conf *conf,
				const struct container_flags *flags,
				const struct image_request *req, char *sqsh)
{
	/* room in NAME_MAX for the ".<jobid>.<stepid>.tmp" of the download */
	char images[PATH_MAX], name[NAME_MAX - 32], lock[PATH_MAX], tmp[PATH_MAX];
	int lock_fd, rc = 0;

	if (image_cache_name(flags->image, name, sizeof(name)) < 0) {
		slurm_error("spank_berth: --container-image: '%s' is too long", flags->image);
		return -1;
	}
	if (path_join(images, "%s/images", st->state_dir) < 0 ||
	    make_dir(images, 0700, st->uid, st->gid) < 0 ||
	    path_join(sqsh, "%s/%s", images, name) < 0 ||
	    path_join(lock, "%s.lock", sqsh) < 0 ||
	    path_join(tmp, "%s.%u.%u.tmp", sqsh, st->jobid, st->stepid) < 0)
		return -1;
	lock_fd = lock_file(lock);
	if (lock_fd < 0)
		return -1;
	if (faccessat(AT_FDCWD, sqsh, R_OK, AT_EACCESS) != 0) { /* as the user: real uid is root */
		slurm_spank_log("spank_berth: importing %s", req->uri);
		unlink(tmp);
		rc = importer_import(sp, st, conf, tmp, req->uri, req->headline);
		if (rc == 0 && rename(tmp, sqsh) < 0) {
			slurm_error("spank_berth: cannot rename %s to %s: %m", tmp, sqsh);
			rc = -1;
		}
		if (rc < 0)
			unlink(tmp);
	}
	close(lock_fd);
	if (rc == 0)
		log_image(st, req->uri, "(not known: the plugstack importer made it)");
	return rc;
}

/*
 * The lines logged about importing req->uri: the notice while it takes long
 * (with the digest resolved at submission, if any), and the headline of a
 * failure, in pyxis's words with the image as the user gave it, which
 * scripts grep for (the runtime's reason follows it).
 */
static void import_messages(struct image_request *req, const char *image, const char *resolved)
{
	snprintf(req->headline, sizeof(req->headline), "pyxis: failed to import docker image: %s",
		 image);
	if (resolved != NULL)
		snprintf(req->notice, sizeof(req->notice), "importing %s into this node's image "
			 "cache (%s, as resolved at submission)", req->uri, resolved);
	else
		snprintf(req->notice, sizeof(req->notice), "importing %s into this node's image "
			 "cache", req->uri);
}

/*
 * 1 and the pinned URI (docker://...@sha256:...) in pinned when the
 * submission resolved uri (submit.h), else 0: import the tag as given.
 */
static int node_image(spank_t sp, const char *uri, char *pinned, size_t len)
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

/*
 * A registry image, imported once per user and node: berth keeps it in the
 * user's image cache (on disk, pruned by the admin's timer) and mounts that
 * file as it is. The submission resolved the tag to a digest
 * (submit_image): the node imports that pinned URI, so every node of the
 * job runs the same image and a moved tag is seen by the next job. --reuse:
 * a step asks the registry only when the node has no image of that URI
 * yet, which for a digest is exact. Without a pinned URI (the submit host
 * could not ask the registry) the tag's last import on this node serves, as
 * --reuse finds it. Fills in req: the URI to import and its messages.
 * -1 (logged): too long.
 */
static int registry_request(spank_t sp, const struct container_flags *flags,
			    struct image_request *req)
{
	if (image_uri(flags->image, req->uri, sizeof(req->uri)) < 0) {
		slurm_error("spank_berth: --container-image: '%s' is too long", flags->image);
		return -1;
	}
	req->target = node_image(sp, req->uri, req->pinned, sizeof(req->pinned))
		? req->pinned : req->uri;
	import_messages(req, flags->image,
			req->target == req->pinned ? strstr(req->pinned, "@sha256:") + 1 : NULL);
	return 0;
}

/* Whether berth imports --container-image from a registry: not a file, an archive or importer=. */
static int registry_image(const struct plugin_conf *conf, const struct container_flags *flags)
{
	return !image_is_file(flags->image) && image_archive_prefix(flags->image) == 0 &&
	       conf->importer[0] == '\0';
}

/*
 * --container-image -> squashfs in the user's image cache ("berth import
 * --cache-only"), for a step that creates a container from it: a registry
 * image as registry_request says, an archive read again each step (a
 * rebuilt archive must not be served stale).
 */
static int import_image(spank_t sp, const struct step *st, const struct plugin_conf *conf,
			const struct container_flags *flags, char *sqsh)
{
	struct image_request req;
	struct answer answer;
	char out[3 * PATH_MAX + 256], err[ERR_LEN]; /* (a path percent-encoded) */
	const char *uri = req.uri;
	int reuse = 0;
	size_t archive = image_archive_prefix(flags->image);
	char path[PATH_MAX];
	int n, too_long, parsed;

	if (archive == 0 && conf->importer[0] == '\0') {
		if (registry_request(sp, flags, &req) < 0)
			return -1;
		uri = req.target;
		reuse = 1;
	} else {
		if (archive > 0 && flags->image[archive] != '/') {
			/* a relative archive path, from the step's directory as for files */
			if (user_path(sp, "--container-image", flags->image + archive, path) < 0)
				return -1;
			n = snprintf(req.uri, sizeof(req.uri), "%.*s%s", (int)archive,
				     flags->image, path);
			too_long = n < 0 || (size_t)n >= sizeof(req.uri);
		} else
			too_long = image_uri(flags->image, req.uri, sizeof(req.uri)) < 0;
		if (too_long) {
			slurm_error("spank_berth: --container-image: '%s' is too long", flags->image);
			return -1;
		}
		import_messages(&req, flags->image, NULL);
		if (conf->importer[0] != '\0')
			return import_with_importer(sp, st, conf, flags, &req, sqsh);
	}
	if (berth_import(sp, st, conf, uri, reuse, out, sizeof(out), req.notice, req.headline) < 0)
		return -1;
	/* the cached squashfs, and the digest it was pulled by */
	answer_init(&answer);
	parsed = answer_parse(out, &answer, err, sizeof(err));
	if (parsed == 0 && (!ANSWER_HAS(&answer, squashfs) || !ANSWER_HAS(&answer, digest)))
		parsed = fail(err, sizeof(err), "its answer has no squashfs or no digest");
	if (parsed < 0) {
		slurm_error("%s", req.headline);
		slurm_error("spank_berth: berth import printed no path and digest for %s: %s",
			    req.uri, err);
		return -1;
	}
	memcpy(sqsh, answer.squashfs, sizeof(answer.squashfs));
	log_image(st, req.uri, answer.digest);
	return 0;
}

/* The squashfs file of --container-image, imported first for a registry image. */
static int resolve_image(spank_t sp, const struct step *st, const struct plugin_conf *conf,
			 const struct container_flags *flags, char *sqsh)
{
	if (image_is_file(flags->image)) {
		if (user_path(sp, "--container-image", flags->image, sqsh) < 0)
			return -1;
		log_image(st, sqsh, image_is_sif(sqsh) ? "(a SIF file)" : "(a squashfs file)");
		return 0;
	}
	return import_image(sp, st, conf, flags, sqsh);
}

int container_exists(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		     const char *name)
{
	char out[65536];
	size_t len = strlen(name);

	if (berth_list(sp, st, conf, out, sizeof(out)) < 0)
		return -1;
	for (char *line = out; *line != '\0'; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != '\0'))
		if (strncmp(line, name, len) == 0 && (line[len] == '\n' || line[len] == '\0'))
			return 1;
	return 0;
}

long pidfile_pid(const char *pidfile)
{
	char buf[32];
	ssize_t n;
	int fd = open(pidfile, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return strtol(buf, NULL, 10);
}

/* pid of a running container recorded in pidfile, or 0. */
static pid_t running_pid(const char *pidfile, uid_t uid)
{
	char proc[64];
	struct stat st;
	long pid = pidfile_pid(pidfile);

	snprintf(proc, sizeof(proc), "/proc/%ld", pid);
	if (pid <= 0 || stat(proc, &st) < 0 || st.st_uid != uid)
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
 * Attaching with --container-unshare=NS: the running container must have
 * its own NS, or the task would share the host's while asking not to.
 */
static int attach_has_namespaces(const struct container_flags *flags, pid_t pid)
{
	static const char *const names[] = { "net", "ipc", "uts" };
	static const char *const said[] = { "network", "IPC", "UTS" }; /* pyxis's words */

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char theirs_path[64], ours_path[64];
		struct stat theirs, ours;

		if (!unshare_has(flags, names[i]))
			continue;
		snprintf(theirs_path, sizeof(theirs_path), "/proc/%ld/ns/%s", (long)pid, names[i]);
		snprintf(ours_path, sizeof(ours_path), "/proc/self/ns/%s", names[i]);
		if (stat(theirs_path, &theirs) < 0 || stat(ours_path, &ours) < 0) {
			slurm_error("spank_berth: cannot compare the %s namespaces: %m", names[i]);
			return -1;
		}
		if (theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev) {
			slurm_error("spank_berth: --container-unshare=%s requested but the container "
				    "is not in a separate %s namespace: the running container '%s' was "
				    "started without it (start it with --container-unshare=%s)",
				    names[i], said[i], flags->name, names[i]);
			return -1;
		}
	}
	return 0;
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

/* What is known of the named container on disk: "berth list" is asked only when needed. */
enum on_disk { ON_DISK_UNASKED, ON_DISK_ABSENT, ON_DISK_PRESENT };

/* Ask "berth list" whether the step's container is on disk; -1 (logged) on failure. */
static int ask_on_disk(spank_t sp, const struct step *st, const struct plugin_conf *conf,
		       enum on_disk *found)
{
	int exists = container_exists(sp, st, conf, st->container);

	if (exists < 0)
		return -1;
	*found = exists ? ON_DISK_PRESENT : ON_DISK_ABSENT;
	return 0;
}

/*
 * The pid of the named container running on this node, or 0. One removed
 * (berth remove -f) while a step still runs in it is not: that step's root
 * is gone, and the name is free for a new container, as in pyxis. (An
 * unnamed step's container has nothing on disk to remove.)
 */
static int find_running(spank_t sp, const struct step *st, const struct plugin_conf *conf,
			const struct container_flags *flags, const char *pidfile,
			pid_t *running, enum on_disk *found)
{
	*running = running_pid(pidfile, st->uid);
	if (*running == 0 || flags->name_mode == NAME_NO_EXEC || is_step_label(flags->name))
		return 0;
	if (ask_on_disk(sp, st, conf, found) < 0)
		return -1;
	if (*found == ON_DISK_ABSENT)
		*running = 0;
	return 0;
}

static int attach_named(struct step *st, const struct container_flags *flags, pid_t running)
{
	if (running == 0) {
		slurm_error("spank_berth: --container-name: '%s' is not running on this node",
			    flags->name);
		return -1;
	}
	if (attach_has_namespaces(flags, running) < 0)
		return -1;
	st->container_pid = running;
	if (flags->mounts != NULL)
		slurm_spank_log("spank_berth: warning: ignoring --container-mounts when "
				"attaching to a running container '%s'", flags->name);
	return 0;
}

/* Start the named container, created first from --container-image if it is not on disk. */
static int start_named(spank_t sp, struct step *st, const struct plugin_conf *conf,
		       const struct container_flags *flags, enum on_disk found)
{
	char sqsh[PATH_MAX];

	/*
	 * Most steps find their container on disk: start it straight away, and
	 * pay for "berth list" only when that fails (or to refuse mode create).
	 */
	if (flags->name_mode != NAME_CREATE && found != ON_DISK_ABSENT &&
	    start_keeper(sp, st, conf, flags, st->container, NULL, KEEPER_QUIET) == 0)
		return 0;
	if (found == ON_DISK_UNASKED && ask_on_disk(sp, st, conf, &found) < 0)
		return -1;
	if (found == ON_DISK_PRESENT && flags->name_mode == NAME_CREATE) {
		slurm_error("spank_berth: --container-name: '%s' exists already (mode create)",
			    flags->name);
		return -1;
	}
	if (found == ON_DISK_ABSENT && flags->image == NULL) {
		slurm_error("spank_berth: --container-name: no container '%s' on this node "
			    "and no --container-image to create it from", flags->name);
		return -1;
	}
	if (found == ON_DISK_ABSENT && (resolve_image(sp, st, conf, flags, sqsh) < 0 ||
					berth_create(sp, st, conf, st->container, sqsh) < 0))
		return -1;
	/* again if it existed: now say why */
	return start_keeper(sp, st, conf, flags, st->container, NULL, KEEPER_REPORT);
}

/* Under the name's lock: attach to the running container, or start it and record it. */
static int use_named(spank_t sp, struct step *st, const struct plugin_conf *conf,
		     const struct container_flags *flags, const char *pidfile)
{
	enum on_disk found = ON_DISK_UNASKED;
	pid_t running;

	if (find_running(sp, st, conf, flags, pidfile, &running, &found) < 0)
		return -1;
	if (flags->name_mode == NAME_EXEC || (flags->name_mode == NAME_AUTO && running))
		return attach_named(st, flags, running);
	if (start_named(sp, st, conf, flags, found) < 0)
		return -1;
	if (running != 0) /* (the old step's end leaves a pid file it no longer names) */
		return 0;
	if (write_pidfile(pidfile, st->container_pid) < 0)
		return -1;
	strcpy(st->pidfile, pidfile);
	return 0;
}

/* --container-name: attach to it running, or create it once and start it. */
static int prepare_named(spank_t sp, struct step *st, const struct plugin_conf *conf,
			 const struct container_flags *flags)
{
	char named[PATH_MAX], lock[PATH_MAX], pidfile[PATH_MAX];
	int lock_fd, rc;

	if (path_join(named, "%s/named", st->state_dir) < 0 ||
	    make_dir(named, 0700, st->uid, st->gid) < 0 ||
	    path_join(lock, "%s/%s.lock", named, st->container) < 0 ||
	    path_join(pidfile, "%s/%s.pid", named, st->container) < 0)
		return -1;
	lock_fd = lock_file(lock);
	if (lock_fd < 0)
		return -1;
	rc = use_named(sp, st, conf, flags, pidfile);
	close(lock_fd);
	return rc;
}

/*
 * An unnamed step's running container is recorded as <prefix>_JOBID.STEPID,
 * so that --container-name=JOBID.STEPID attaches to it (as pyxis names it).
 */
static int record_unnamed(struct step *st, const struct plugin_conf *conf)
{
	char named[PATH_MAX], pidfile[PATH_MAX];

	if (path_join(named, "%s/named", st->state_dir) < 0 ||
	    make_dir(named, 0700, st->uid, st->gid) < 0 ||
	    path_join(pidfile, "%s/%s_%s.pid", named, conf->container_prefix, st->label) < 0 ||
	    write_pidfile(pidfile, st->container_pid) < 0)
		return -1;
	strcpy(st->pidfile, pidfile);
	return 0;
}

/* Import, create and start this step's container; -1 (logged) on failure. */
int setup_container(spank_t sp, struct step *st, const struct plugin_conf *conf,
		    const struct container_flags *flags)
{
	char sqsh[PATH_MAX];
	int n;

	if (make_dir(st->state_dir, 0700, st->uid, st->gid) < 0 ||
	    make_dir(st->step_dir, 0700, st->uid, st->gid) < 0)
		return -1;
	if (flags->name != NULL) {
		/* a step's container is the job's already: no job scope prefix */
		n = conf->container_scope == CONTAINER_SCOPE_JOB && !is_step_label(flags->name)
			? snprintf(st->container, sizeof(st->container), "%s_%u_%s",
				   conf->container_prefix, st->jobid, flags->name)
			: snprintf(st->container, sizeof(st->container), "%s_%s",
				   conf->container_prefix, flags->name);
		if (n < 0 || (size_t)n >= sizeof(st->container)) {
			slurm_error("spank_berth: --container-name: '%s' is too long", flags->name);
			return -1;
		}
		return prepare_named(sp, st, conf, flags);
	}
	if (flags->save == NULL && registry_image(conf, flags)) {
		/* one runtime call: the keeper imports the image, then starts it */
		struct image_request req;

		if (registry_request(sp, flags, &req) < 0)
			return -1;
		/* pyxis's two lines, which scripts count on: honest about a cached image */
		slurm_spank_log("pyxis: importing docker image: %s", flags->image);
		if (start_keeper(sp, st, conf, flags, NULL, &req, KEEPER_REPORT) < 0)
			return -1;
		slurm_spank_log("pyxis: imported docker image: %s%s", flags->image,
				req.cached ? " (this node had it: nothing was downloaded)" : "");
		log_image(st, req.uri, req.digest);
		return record_unnamed(st, conf);
	}
	if (resolve_image(sp, st, conf, flags, sqsh) < 0)
		return -1;
	if (flags->save == NULL) {
		if (start_keeper(sp, st, conf, flags, sqsh, NULL, KEEPER_REPORT) < 0)
			return -1;
		return record_unnamed(st, conf);
	}
	/* Saving needs a container on disk; a mounted image leaves nothing to save. */
	snprintf(st->container, sizeof(st->container), "%s_%s", conf->container_prefix,
		 st->label);
	if (berth_create(sp, st, conf, st->container, sqsh) < 0)
		return -1;
	st->remove_container = 1;
	if (start_keeper(sp, st, conf, flags, st->container, NULL, KEEPER_REPORT) < 0)
		return -1;
	return record_unnamed(st, conf);
}

