/* Paths on the node: bounded joins, the plugin's directories, the user's paths. */
#ifndef BERTH_SPANK_PATHS_H
#define BERTH_SPANK_PATHS_H

#include <sys/types.h>

#include <slurm/spank.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/* printf into out (PATH_MAX bytes); -1 (logged) when it does not fit. */
int path_join(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* mkdir that accepts an existing directory owned by uid; as root, chown it to uid:gid. */
int make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid);

/* A path from the command line (flag names it), relative to where srun ran. */
int user_path(spank_t sp, const char *flag, const char *path, char *out);

#pragma GCC visibility pop

#endif
