/* See paths.h. */
#define _GNU_SOURCE
#include "paths.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int path_join(char *out, const char *fmt, ...)
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

int make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid)
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

int user_path(spank_t sp, const char *flag, const char *path, char *out)
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
