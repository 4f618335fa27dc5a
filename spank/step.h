/*
 * The state of one step on one node (slurmstepd, remote context), and the
 * processes the plugin holds. spank_berth.c owns the one instance and hands
 * it to the modules as a parameter.
 *
 * The modules' functions are declared hidden (#pragma GCC visibility in
 * their headers): calls between them stay inside the plugin. An exported
 * one would be bound to a symbol of the same name in the program that
 * loads the plugin: slurmstepd exports its own setup_container.
 */
#ifndef BERTH_SPANK_STEP_H
#define BERTH_SPANK_STEP_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

/* The plugin's version, which tasks see as BERTH_VERSION. */
#define BERTH_SPANK_VERSION "0.1.0"

/*
 * A process the plugin forked, held by a pidfd opened before it could exit
 * (fork_user): signals and waits go through the pidfd, never through a pid
 * that the process may have left to another one.
 */
struct child {
	pid_t pid;
	int pidfd; /* -1: none */
};

/* One step on one node (remote context). */
struct step {
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
	long long deadline_ms;     /* > 0: no runtime command runs past it (now_ms() time):
				      the epilog's one bound for all its commands */
};

/* A step with no keeper yet. */
#define STEP_INIT { .keeper = { 0, -1 }, .keeper_stdin = -1 }

#endif
