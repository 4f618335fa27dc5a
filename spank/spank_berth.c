/*
 * spank_berth: pyxis-compatible --container-* flags for srun/sbatch/salloc.
 *
 * A thin caller of the berth runtime. Per step and node (slurmstepd):
 *   init_post_opt (root)  make runtime_path/<uid>/ for the user; the plugin
 *                         keeps its files in runtime_path/<uid>/spank/
 *   user_init (user)      berth import and berth create (named containers), then
 *                         "berth start --detach", which prints the container
 *                         pid and lives until its stdin closes; an unnamed
 *                         step's registry image it imports itself (--reuse URI)
 *                         into the user's image cache on the node
 *   task_init (user)      join that pid's namespaces, chdir, merge env
 *   task_exit (root)      after the last local task: close the keeper's
 *                         stdin, berth export, berth remove
 * Flag values are checked on the submission side (container_flags.c) so a
 * bad flag fails srun/sbatch before anything runs; there too, --environment and a
 * registry image's tag are resolved once for the job (submit.c): srun
 * collects that resolve in local_user_init, after its allocation.
 *
 * This file holds the SPANK entry points and the option table only; each
 * entry point hands its work to one module (docs/architecture/plugin.md, "Source layout").
 */
#define _GNU_SOURCE
#include "container_flags.h"
#include "plugstack.h"
#include "container.h"
#include "step.h"
#include "stepend.h"
#include "submit.h"
#include "task.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

/*
 * Registered under pyxis's name: Slurm exports a submission's option values
 * to the job as SLURM_SPANK__SLURM_SPANK_OPTION_<plugin>_<option>, and job
 * scripts read and unset those by pyxis's name.
 */
SPANK_PLUGIN(pyxis, 1);

/*
 * The plugin's state. SPANK hands a callback no pointer of the plugin's
 * own, so these are file-level here and nowhere else: the entry points
 * below own them and pass them to the modules as parameters.
 */
static struct plugin_conf conf;
static struct container_flags flags;
static struct step step = STEP_INIT;
static struct image_resolve image_resolve = IMAGE_RESOLVE_INIT;

enum opt_id {
	OPT_IMAGE, OPT_MOUNTS, OPT_WORKDIR, OPT_NAME, OPT_SAVE,
	OPT_MOUNT_HOME, OPT_NO_MOUNT_HOME, OPT_REMAP_ROOT, OPT_NO_REMAP_ROOT,
	OPT_ENTRYPOINT, OPT_NO_ENTRYPOINT, OPT_ENTRYPOINT_LOG,
	OPT_WRITABLE, OPT_READONLY, OPT_ENV, OPT_UNSHARE, OPT_ENVIRONMENT, OPT_DEVICE,
};

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
	{ "container-device", "VENDOR/CLASS=NAME[,...]",
	  "[berth] CDI devices, resolved by the node's specs", 1, OPT_DEVICE, on_option },
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
	case OPT_DEVICE:
		rc = set_devices(&flags, optarg, err, sizeof(err));
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
	if (pyxis_env(sp, remote, &flags) < 0)
		return -1;
	if (!remote) {
		if (flags.environment != NULL && submit_environment(&conf, &flags) < 0)
			return -1;
		if (flags_check(&flags, err, sizeof(err)) < 0) {
			slurm_error("spank_berth: %s", err);
			return -1;
		}
		if (submit_check_image(&conf, &flags) < 0)
			return -1;
		/* the tag's digest now, for every node; srun's allocation meanwhile */
		if (submit_image_start(&conf, &flags, &image_resolve) < 0)
			return -1;
		if (spank_context() != S_CTX_LOCAL)
			return submit_image_finish(&conf, &image_resolve);
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
	return step_init(sp, &step, &conf, &flags);
}

/*
 * srun, allocation granted, the step not launched yet: its environment is
 * still ours to set, and a resolve that will not pass still ends srun
 * before any node imports.
 */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	return submit_image_finish(&conf, &image_resolve);
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
	if (setup_container(sp, &step, &conf, &flags) < 0)
		step.setup_failed = 1;
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
	return task_join(sp, &step, &flags);
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
	return finish_step(sp, &step, &conf, &flags);
}

/* container_scope=job: the job's named containers end with it (slurmd's epilog, as root). */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	char err[ERR_LEN];

	/* slurm_spank_init does not run before the epilog */
	if (conf_parse(&conf, ac, av, err, sizeof(err)) < 0) {
		slurm_error("spank_berth: plugstack.conf: %s", err);
		return -1;
	}
	if (conf.container_scope != CONTAINER_SCOPE_JOB)
		return 0;
	return epilog_remove(sp, &step, &conf);
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	int rc = 0;

	(void)ac;
	(void)av;
	/* steps whose tasks never started */
	if (spank_context() == S_CTX_REMOTE && step.active)
		rc = finish_step(sp, &step, &conf, &flags);
	/* an srun that ends before its launch (no allocation) */
	submit_image_cancel(&image_resolve);
	flags_free(&flags);
	return rc;
}
