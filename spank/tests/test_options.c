/*
 * Tests for the option parser (PARSER_SRC in the Makefile): plugstack
 * options, flag values, EDF lines, PYXIS_CONTAINER_*, env merge rules, and
 * the runtime's --porcelain answer.
 * Prints one line per failed check and exits 1 if any failed.
 * Run under valgrind by tests/test_spank_plugin.py.
 */
#include "../answer.h"
#include "../container_flags.h"
#include "../edf.h"
#include "../env_merge.h"
#include "../image_ref.h"
#include "../plugstack.h"
#include "../pyxis_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
static char err[ERR_LEN];

#define CHECK(cond) do { \
	if (!(cond)) { \
		printf("FAIL %s:%d: %s (err: %s)\n", __FILE__, __LINE__, #cond, err); \
		failures++; \
	} \
} while (0)

/* rc == -1 and the message contains want */
#define REFUSED(call, want) do { \
	err[0] = '\0'; \
	CHECK((call) == -1); \
	CHECK(strstr(err, (want)) != NULL); \
} while (0)

#define ACCEPTED(call) do { err[0] = '\0'; CHECK((call) == 0); } while (0)

static int parse(struct plugin_conf *conf, const char *a, const char *b)
{
	char *argv[2] = { (char *)a, (char *)b };

	return conf_parse(conf, (a != NULL) + (b != NULL), argv, err, sizeof(err));
}

static void test_conf(void)
{
	struct plugin_conf conf;

	ACCEPTED(parse(&conf, NULL, NULL));
	CHECK(strcmp(conf.runtime_path, "/run/berth") == 0);
	CHECK(strcmp(conf.berth, "/usr/local/bin/berth") == 0);
	CHECK(conf.importer[0] == '\0');
	CHECK(conf.sbatch_support == 1 && conf.execute_entrypoint == 0);
	CHECK(conf.container_scope == CONTAINER_SCOPE_GLOBAL && conf.use_enroot_load == 0);
	CHECK(conf.use_squashfuse == 0);
	CHECK(conf.cleanup_timeout == 600);
	CHECK(strcmp(conf.container_prefix, "pyxis") == 0);
	ACCEPTED(parse(&conf, "container_prefix=site-a.1_x", NULL));
	CHECK(strcmp(conf.container_prefix, "site-a.1_x") == 0);
	REFUSED(parse(&conf, "container_prefix=", NULL), "container_prefix: '' is not 1 to 32");
	REFUSED(parse(&conf, "container_prefix=a/b", NULL), "container_prefix: 'a/b'");
	REFUSED(parse(&conf, "container_prefix=.x", NULL), "container_prefix: '.x'");
	REFUSED(parse(&conf, "container_prefix=abcdefghijklmnopqrstuvwxyz0123456", NULL),
		"is not 1 to 32");

	ACCEPTED(parse(&conf, "runtime_path=/var/run/b", "container_scope=job"));
	CHECK(strcmp(conf.runtime_path, "/var/run/b") == 0);
	CHECK(conf.container_scope == CONTAINER_SCOPE_JOB);
	ACCEPTED(parse(&conf, "berth=/opt/berth/bin/berth", "importer=/usr/bin/enroot"));
	CHECK(strcmp(conf.berth, "/opt/berth/bin/berth") == 0);
	CHECK(strcmp(conf.importer, "/usr/bin/enroot") == 0);
	ACCEPTED(parse(&conf, "sbatch_support=n", "execute_entrypoint=YES"));
	CHECK(conf.sbatch_support == 0 && conf.execute_entrypoint == 1);
	ACCEPTED(parse(&conf, "use_enroot_load=true", "use_squashfuse=1"));
	CHECK(conf.use_enroot_load == 1 && conf.use_squashfuse == 1);

	REFUSED(parse(&conf, "runtime_pth=/x", NULL), "unknown plugstack option 'runtime_pth'");
	REFUSED(parse(&conf, "sbatch_support=maybe", NULL),
		"sbatch_support: 'maybe' is not a boolean");
	REFUSED(parse(&conf, "use_squashfuse=", NULL), "use_squashfuse: '' is not a boolean");
	REFUSED(parse(&conf, "container_scope=node", NULL),
		"container_scope: 'node' is neither job nor global");
	REFUSED(parse(&conf, "runtime_path=run/berth", NULL),
		"runtime_path: 'run/berth' is not an absolute path");
	ACCEPTED(parse(&conf, "cleanup_timeout=15", NULL));
	CHECK(conf.cleanup_timeout == 15);
	ACCEPTED(parse(&conf, "cleanup_timeout=86400", NULL));
	CHECK(conf.cleanup_timeout == 86400);
	REFUSED(parse(&conf, "cleanup_timeout=0", NULL),
		"cleanup_timeout: 0 is not between 1 and 86400 seconds");
	REFUSED(parse(&conf, "cleanup_timeout=86401", NULL), "not between 1 and 86400");
	REFUSED(parse(&conf, "cleanup_timeout=10s", NULL),
		"cleanup_timeout: '10s' is not a number of seconds");
	REFUSED(parse(&conf, "cleanup_timeout=-5", NULL), "not a number of seconds");
	REFUSED(parse(&conf, "cleanup_timeout=", NULL), "not a number of seconds");
	REFUSED(parse(&conf, "cleanup_timeout=9999999999", NULL), "not a number of seconds");
	REFUSED(parse(&conf, "berth", NULL), "'berth' is not key=value");
	REFUSED(parse(&conf, "=yes", NULL), "bad key");
}

/* conf_defaults parses each default of plugstack_keys.h unchecked: each must
 * be a value the parser takes, and give what conf_defaults gives. */
static void test_table_defaults(void)
{
	static const struct { const char *key, *def; } keys[] = {
#define PLUGSTACK_KEY(key, kind, def, min, max) { #key, def },
#include "../plugstack_keys.h"
#undef PLUGSTACK_KEY
	};
	struct plugin_conf defaults, given;
	char arg[PATH_MAX + 64];

	conf_defaults(&defaults);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (keys[i].def[0] == '\0')
			continue;
		snprintf(arg, sizeof(arg), "%s=%s", keys[i].key, keys[i].def);
		ACCEPTED(parse(&given, arg, NULL));
		CHECK(memcmp(&given, &defaults, sizeof(given)) == 0);
	}
}

static void test_bool(void)
{
	const char *yes[] = { "1", "true", "True", "yes", "Y" };
	const char *no[] = { "0", "false", "NO", "n" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		CHECK(parse_bool(yes[i]) == 1);
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		CHECK(parse_bool(no[i]) == 0);
	CHECK(parse_bool("on") == -1);
	CHECK(parse_bool("") == -1);
	CHECK(parse_bool("yess") == -1);
}

static void test_image(struct container_flags *f)
{
	char path[] = "/tmp/bspk-test-XXXXXX.sqsh";
	int fd = mkstemps(path, 5);

	CHECK(fd >= 0);
	close(fd);
	ACCEPTED(set_image(f, "ubuntu", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "python:3", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "nvcr.io#nvidia/cuda:12.9", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "user@nvcr.io#nvidia/cuda", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "ubuntu@sha256:0123abcd", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "docker://localhost:5000#busybox", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, path, 1, err, sizeof(err)));
	CHECK(strcmp(f->image, path) == 0);
	/* on the compute node the file is not checked again */
	ACCEPTED(set_image(f, "/nonexistent/img.sqsh", 0, err, sizeof(err)));
	unlink(path);

	REFUSED(set_image(f, "", 1, err, sizeof(err)), "--container-image: empty image");
	REFUSED(set_image(f, "/nonexistent/img.sqsh", 1, err, sizeof(err)),
		"--container-image: no such file '/nonexistent/img.sqsh'");
	REFUSED(set_image(f, "img.sqsh", 1, err, sizeof(err)), "no such file 'img.sqsh'");
	REFUSED(set_image(f, "/tmp", 1, err, sizeof(err)), "'/tmp' is not a file");
	REFUSED(set_image(f, "nvcr.io", 1, err, sizeof(err)),
		"'nvcr.io' is a registry host without an image");
	REFUSED(set_image(f, "localhost:5000", 1, err, sizeof(err)), "registry host");
	REFUSED(set_image(f, "user@registry.example.com", 1, err, sizeof(err)), "registry host");
	REFUSED(set_image(f, "nvcr.io#", 1, err, sizeof(err)), "ends without an image name");
	REFUSED(set_image(f, "ubuntu:", 1, err, sizeof(err)), "ends without an image name");
	/* a refused value leaves the previous one in place */
	CHECK(strcmp(f->image, "/nonexistent/img.sqsh") == 0);

	ACCEPTED(set_image(f, "docker-archive:/srv/app.tar", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "oci-archive:app.tar:v1", 1, err, sizeof(err)));
	ACCEPTED(set_image(f, "oci:/srv/layout", 1, err, sizeof(err)));
	REFUSED(set_image(f, "docker-archive:", 1, err, sizeof(err)),
		"--container-image: 'docker-archive:' names no archive");
	REFUSED(set_image(f, "oci::v1", 1, err, sizeof(err)), "names no archive");
	CHECK(image_archive_prefix("oci-archive:x.tar") == strlen("oci-archive:"));
	CHECK(image_archive_prefix("ocifoo:1") == 0 && image_archive_prefix("/x.tar") == 0);

	CHECK(image_is_file("./a.sqsh") && image_is_file("/x") && image_is_file("a.sqsh"));
	CHECK(image_is_file("app.sif") && image_is_sif("/x/app.sif") && !image_is_sif("a.sqsh"));
	CHECK(!image_is_file("sif") && !image_is_sif(".sif") && !image_is_file("ubuntu:sif"));
	CHECK(!image_is_file("ubuntu:22.04") && !image_is_file("nvcr.io#nvidia/cuda"));
}

static void test_image_names(void)
{
	char out[64];

	CHECK(image_uri("nvcr.io#nvidia/cuda:12.9", out, sizeof(out)) == 0);
	CHECK(strcmp(out, "docker://nvcr.io#nvidia/cuda:12.9") == 0);
	CHECK(image_uri("podman://ubuntu", out, sizeof(out)) == 0);
	CHECK(strcmp(out, "podman://ubuntu") == 0);
	CHECK(image_uri("ubuntu", out, 8) == -1);
	CHECK(image_uri("docker-archive:/srv/a.tar", out, sizeof(out)) == 0);
	CHECK(strcmp(out, "docker-archive:/srv/a.tar") == 0);

	CHECK(image_cache_name("nvcr.io#nvidia/cuda:12.9", out, sizeof(out)) == 0);
	CHECK(strcmp(out, "nvcr.io+nvidia+cuda+12.9.sqsh") == 0);
	CHECK(image_cache_name("docker://u@localhost:5000#a/b", out, sizeof(out)) == 0);
	CHECK(strcmp(out, "u+localhost+5000+a+b.sqsh") == 0);
	CHECK(image_cache_name("ubuntu", out, 10) == -1);
	CHECK(image_cache_name("", out, sizeof(out)) == -1);
}

static void test_image_pin(void)
{
	static const char pinned[] = "docker://nvcr.io#nvidia/cuda@sha256:"
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
	const char *uri = "docker://nvcr.io#nvidia/cuda:12.9";
	char text[256];

	snprintf(text, sizeof(text), "%s\n%s", uri, pinned);
	CHECK(image_pin(text, uri) != NULL && strcmp(image_pin(text, uri), pinned) == 0);
	/* for another image, or a prefix of this one's URI: not ours */
	CHECK(image_pin(text, "docker://nvcr.io#nvidia/cuda:12") == NULL);
	CHECK(image_pin(text, "docker://nvcr.io#nvidia/cuda:12.9.1") == NULL);
	CHECK(image_pin(text, "") == NULL);
	/* the pinned part must be one docker:// line with a digest */
	CHECK(image_pin("docker://a:1\ndocker://a:1", "docker://a:1") == NULL);
	CHECK(image_pin("docker://a:1\n/tmp/a.sqsh@sha256:00", "docker://a:1") == NULL);
	CHECK(image_pin("docker://a:1\ndocker://a@sha256:00\nx", "docker://a:1") == NULL);
	CHECK(image_pin("docker://a:1\n", "docker://a:1") == NULL);
	/* a SIF image's oras:// tag, pinned in its own scheme only */
	CHECK(image_pin("oras://h/a:1\noras://h/a@sha256:00", "oras://h/a:1") != NULL);
	CHECK(image_pin("oras://h/a:1\ndocker://h#a@sha256:00", "oras://h/a:1") == NULL);
	CHECK(image_pin("docker://a:1\noras://a@sha256:00", "docker://a:1") == NULL);
	CHECK(image_pin("dockerd://a:1\ndockerd://a@sha256:00", "dockerd://a:1") == NULL);
	CHECK(image_pin("docker://a:1", "docker://a:1") == NULL);
}

static void test_mounts(struct container_flags *f)
{
	ACCEPTED(set_mounts(f, "/data:/data", err, sizeof(err)));
	ACCEPTED(set_mounts(f, "/a:/b:noatime+x-create=auto+nofail", err, sizeof(err)));
	ACCEPTED(set_mounts(f, "/a:/b:ro+unbindable,/c:/d:runbindable+rprivate", err, sizeof(err)));
	/* SRC alone, relative sources, tmpfs (with options) and umount */
	ACCEPTED(set_mounts(f, "/data", err, sizeof(err)));
	ACCEPTED(set_mounts(f, "./data:/data,.:/work,data:/d:ro", err, sizeof(err)));
	ACCEPTED(set_mounts(f, "tmpfs:/scratch,tmpfs:/t:size=1M+mode=1777+huge=always",
			    err, sizeof(err)));
	ACCEPTED(set_mounts(f, "umount:/dev/shm", err, sizeof(err)));
	ACCEPTED(set_mounts(f, "/a:/b:ro,/c:/d:rbind+rprivate+x-create=dir", err, sizeof(err)));
	CHECK(strcmp(f->mounts, "/a:/b:ro,/c:/d:rbind+rprivate+x-create=dir") == 0);
	CHECK(mount_is_special("tmpfs:/x", 8) && mount_is_special("umount:/x", 9));
	CHECK(!mount_is_special("tmpfs", 5) && !mount_is_special("/tmpfs:/x", 9));

	REFUSED(set_mounts(f, "data", err, sizeof(err)),
		"--container-mounts: 'data' alone is also the destination");
	REFUSED(set_mounts(f, "/a:/b,/data:", err, sizeof(err)), "missing destination in '/data:'");
	REFUSED(set_mounts(f, ":/b", err, sizeof(err)), "missing source in ':/b'");
	/* a relative destination is the node's to resolve, from the container's root */
	ACCEPTED(set_mounts(f, "/a:./b,/a:../b,tmpfs:./scratch,umount:./x", err, sizeof(err)));
	CHECK(strcmp(f->mounts, "/a:./b,/a:../b,tmpfs:./scratch,umount:./x") == 0);
	/* but as pyxis takes one: it starts with '.' */
	REFUSED(set_mounts(f, "/tmp:mnt:ro", err, sizeof(err)),
		"--container-mounts: mount target must be a relative path or an absolute path, "
		"in '/tmp:mnt:ro'");
	REFUSED(set_mounts(f, "/a:/b,tmpfs:scratch", err, sizeof(err)), "in 'tmpfs:scratch'");
	REFUSED(set_mounts(f, "umount:x", err, sizeof(err)), "mount target must be a relative");
	REFUSED(set_mounts(f, "umount:", err, sizeof(err)), "missing destination in 'umount:'");
	REFUSED(set_mounts(f, "umount:/x:ro", err, sizeof(err)), "umount takes no flag but nofail");
	ACCEPTED(set_mounts(f, "umount:/x:nofail,/d.sqsh:/d:sqsh,/a:/b:nosymfollow+dirsync",
			    err, sizeof(err)));
	ACCEPTED(set_mounts(f, "/a:/b:ro,/c:/d:rbind+rprivate+x-create=dir", err, sizeof(err)));
	REFUSED(set_mounts(f, "tmpfs:/t:size=1M+", err, sizeof(err)), "empty flag");
	REFUSED(set_mounts(f, "tmpfs:/t:$(x)", err, sizeof(err)), "unknown tmpfs option '$(x)'");
	REFUSED(set_mounts(f, "/a:/b:rx", err, sizeof(err)), "unknown flag 'rx' in '/a:/b:rx'");
	REFUSED(set_mounts(f, "/a:/b:size=1M", err, sizeof(err)), "unknown flag 'size=1M'");
	REFUSED(set_mounts(f, "/a:/b:ro+", err, sizeof(err)), "empty flag in '/a:/b:ro+'");
	REFUSED(set_mounts(f, "/a:/b:", err, sizeof(err)), "empty flags in '/a:/b:'");
	REFUSED(set_mounts(f, "/a:/b,,/c:/d", err, sizeof(err)), "empty entry");
	REFUSED(set_mounts(f, "", err, sizeof(err)), "empty value");
	CHECK(strcmp(f->mounts, "/a:/b:ro,/c:/d:rbind+rprivate+x-create=dir") == 0);
}

static void test_switches(void)
{
	static const enum switch_id pairs[][2] = {
		{ SW_WRITABLE, SW_READONLY }, { SW_MOUNT_HOME, SW_NO_MOUNT_HOME },
		{ SW_REMAP_ROOT, SW_NO_REMAP_ROOT }, { SW_ENTRYPOINT, SW_NO_ENTRYPOINT },
	};
	struct container_flags f;

	flags_init(&f);
	ACCEPTED(set_switch(&f, SW_WRITABLE, err, sizeof(err)));
	ACCEPTED(set_switch(&f, SW_WRITABLE, err, sizeof(err)));
	CHECK(f.writable == ON);
	REFUSED(set_switch(&f, SW_READONLY, err, sizeof(err)),
		"--container-writable and --container-readonly were both specified");
	CHECK(f.writable == ON);
	for (size_t i = 1; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		flags_init(&f);
		ACCEPTED(set_switch(&f, pairs[i][1], err, sizeof(err)));
		REFUSED(set_switch(&f, pairs[i][0], err, sizeof(err)), "were both specified");
	}
	flags_init(&f);
	ACCEPTED(set_switch(&f, SW_ENTRYPOINT, err, sizeof(err)));
	REFUSED(set_switch(&f, SW_NO_ENTRYPOINT, err, sizeof(err)),
		"--container-entrypoint and --no-container-entrypoint were both specified");
	flags_init(&f);
	ACCEPTED(set_switch(&f, SW_NO_MOUNT_HOME, err, sizeof(err)));
	ACCEPTED(set_switch(&f, SW_REMAP_ROOT, err, sizeof(err)));
	ACCEPTED(set_switch(&f, SW_READONLY, err, sizeof(err)));
	ACCEPTED(set_switch(&f, SW_ENTRYPOINT_LOG, err, sizeof(err)));
	CHECK(f.mount_home == OFF && f.remap_root == ON && f.writable == OFF);
	CHECK(f.entrypoint == UNSET && f.entrypoint_log == 1);
}

/* A fake environment: NAME=VALUE strings, NULL-terminated. */
static const char *fake_env(const char *name, void *ctx)
{
	size_t n = strlen(name);

	for (const char *const *e = ctx; *e != NULL; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}

static int with_env(struct container_flags *f, const char *const *env)
{
	err[0] = '\0';
	return apply_pyxis_env(f, fake_env, (void *)env, 0, err, sizeof(err));
}

static void test_pyxis_env(void)
{
	const char *const all[] = {
		"PYXIS_CONTAINER_IMAGE=ubuntu:24.04", "PYXIS_CONTAINER_MOUNTS=/a:/b,tmpfs:/t",
		"PYXIS_CONTAINER_WORKDIR=work", "PYXIS_CONTAINER_NAME=dev:exec",
		"PYXIS_CONTAINER_SAVE=/s.sqsh", "PYXIS_CONTAINER_MOUNT_HOME=no",
		"PYXIS_CONTAINER_REMAP_ROOT=Yes", "PYXIS_CONTAINER_ENTRYPOINT=1",
		"PYXIS_CONTAINER_ENTRYPOINT_LOG=true", "PYXIS_CONTAINER_READONLY=y",
		"PYXIS_CONTAINER_WRITABLE=0", "PYXIS_CONTAINER_ENV=PATH,HOME",
		"PYXIS_CONTAINER_UNSHARE=net", NULL,
	};
	const char *const none[] = { "PYXIS_CONTAINER_IMAGE=", "OTHER=1", NULL };
	struct container_flags f;

	flags_init(&f);
	ACCEPTED(with_env(&f, all));
	CHECK(f.image && strcmp(f.image, "ubuntu:24.04") == 0);
	CHECK(f.mounts && strcmp(f.mounts, "/a:/b,tmpfs:/t") == 0);
	CHECK(f.workdir && strcmp(f.workdir, "work") == 0);
	CHECK(f.name && strcmp(f.name, "dev") == 0 && f.name_mode == NAME_EXEC);
	CHECK(f.save && strcmp(f.save, "/s.sqsh") == 0);
	CHECK(f.env_names && strcmp(f.env_names, "PATH,HOME") == 0);
	CHECK(f.unshare && strcmp(f.unshare, "net") == 0);
	CHECK(f.mount_home == OFF && f.remap_root == ON && f.entrypoint == ON);
	CHECK(f.entrypoint_log == 1 && f.writable == OFF);
	flags_free(&f);

	/* the flags win */
	ACCEPTED(set_image(&f, "debian", 0, err, sizeof(err)));
	ACCEPTED(set_workdir(&f, "/w", err, sizeof(err)));
	ACCEPTED(set_switch(&f, SW_MOUNT_HOME, err, sizeof(err)));
	ACCEPTED(set_switch(&f, SW_WRITABLE, err, sizeof(err)));
	ACCEPTED(set_unshare(&f, "ipc", err, sizeof(err)));
	ACCEPTED(with_env(&f, all));
	CHECK(strcmp(f.image, "debian") == 0 && strcmp(f.workdir, "/w") == 0);
	CHECK(f.mount_home == ON && f.writable == ON && strcmp(f.unshare, "ipc") == 0);
	CHECK(f.remap_root == ON && strcmp(f.name, "dev") == 0);
	flags_free(&f);

	ACCEPTED(with_env(&f, none));
	CHECK(f.image == NULL && !flags_want_container(&f));

	/* bad values name the variable */
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_MOUNTS=/tmp:mnt", NULL }),
		"PYXIS_CONTAINER_MOUNTS (as --container-mounts): mount target must be a relative "
		"path or an absolute path, in '/tmp:mnt'");
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_MOUNT_HOME=maybe", NULL }),
		"PYXIS_CONTAINER_MOUNT_HOME: 'maybe' is not a boolean");
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_MOUNTS=/a:", NULL }),
		"PYXIS_CONTAINER_MOUNTS (as --container-mounts): missing destination in '/a:'");
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_IMAGE=nvcr.io", NULL }),
		"PYXIS_CONTAINER_IMAGE (as --container-image): 'nvcr.io' is a registry host");
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_NAME=a/b", NULL }),
		"PYXIS_CONTAINER_NAME (as --container-name)");
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_WRITABLE=1",
						    "PYXIS_CONTAINER_READONLY=1", NULL }),
		"PYXIS_CONTAINER_WRITABLE and PYXIS_CONTAINER_READONLY were both specified");
	flags_free(&f);
	REFUSED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_WRITABLE=0",
						    "PYXIS_CONTAINER_READONLY=0", NULL }),
		"PYXIS_CONTAINER_WRITABLE and PYXIS_CONTAINER_READONLY were both specified");
	flags_free(&f);

	/* false is the other switch, set explicitly: it beats ENROOT_ROOTFS_WRITABLE */
	ACCEPTED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_WRITABLE=0", NULL }));
	CHECK(f.writable == OFF);
	flags_free(&f);
	ACCEPTED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_READONLY=no", NULL }));
	CHECK(f.writable == ON);
	flags_free(&f);
	ACCEPTED(with_env(&f, (const char *const[]){ "PYXIS_CONTAINER_ENTRYPOINT_LOG=0", NULL }));
	CHECK(f.entrypoint_log == 0);
	flags_free(&f);
}

static void test_name(struct container_flags *f)
{
	ACCEPTED(set_name(f, "pytorch", err, sizeof(err)));
	CHECK(strcmp(f->name, "pytorch") == 0 && f->name_mode == NAME_AUTO);
	ACCEPTED(set_name(f, "my_env-2.1:exec", err, sizeof(err)));
	CHECK(strcmp(f->name, "my_env-2.1") == 0 && f->name_mode == NAME_EXEC);
	ACCEPTED(set_name(f, "a:no_exec", err, sizeof(err)));
	CHECK(f->name_mode == NAME_NO_EXEC);
	ACCEPTED(set_name(f, "sif", err, sizeof(err)));
	ACCEPTED(set_name(f, "a:create", err, sizeof(err)));
	CHECK(f->name_mode == NAME_CREATE);

	REFUSED(set_name(f, "a:rm", err, sizeof(err)), "--container-name: unknown mode 'rm'");
	/* the runtime takes a target ending so for an image file, not a name */
	REFUSED(set_name(f, "app.sif:exec", err, sizeof(err)), "'app.sif' ends as an image file's");
	REFUSED(set_name(f, "app.sqsh", err, sizeof(err)), "(.sqsh, .sif)");
	REFUSED(set_name(f, "a:", err, sizeof(err)), "unknown mode ''");
	REFUSED(set_name(f, ":exec", err, sizeof(err)), "empty name");
	REFUSED(set_name(f, "a/b", err, sizeof(err)), "'a/b' may only use");
	REFUSED(set_name(f, "..", err, sizeof(err)), "starts with '.'");
	CHECK(strcmp(f->name, "a") == 0 && f->name_mode == NAME_CREATE);
}

static void test_other_flags(struct container_flags *f)
{
	ACCEPTED(set_workdir(f, "/workspace", err, sizeof(err)));
	/* relative: resolved inside the container */
	ACCEPTED(set_workdir(f, "work", err, sizeof(err)));
	ACCEPTED(set_workdir(f, "../tmp", err, sizeof(err)));
	REFUSED(set_workdir(f, "", err, sizeof(err)), "--container-workdir: empty path");

	ACCEPTED(set_save(f, "/scratch/out.sqsh", err, sizeof(err)));
	REFUSED(set_save(f, "", err, sizeof(err)), "--container-save: empty path");
	REFUSED(set_save(f, "/scratch/", err, sizeof(err)), "is a directory");

	ACCEPTED(set_env_names(f, "PATH,LD_LIBRARY_PATH,_X1", err, sizeof(err)));
	REFUSED(set_env_names(f, "PATH,,X", err, sizeof(err)), "--container-env: empty name");
	REFUSED(set_env_names(f, "1X", err, sizeof(err)), "'1X' is not a variable name");
	REFUSED(set_env_names(f, "A-B", err, sizeof(err)), "'A-B' is not a variable name");

	ACCEPTED(set_unshare(f, "net,uts", err, sizeof(err)));
	CHECK(unshare_has(f, "net") && unshare_has(f, "uts") && !unshare_has(f, "ipc"));
	REFUSED(set_unshare(f, "net,pid", err, sizeof(err)),
		"--container-unshare: unknown namespace 'pid'");
	REFUSED(set_unshare(f, "", err, sizeof(err)), "unknown namespace ''");
	REFUSED(set_unshare(f, "netx", err, sizeof(err)), "unknown namespace 'netx'");
}

static void test_flags_check(void)
{
	struct container_flags f;

	flags_init(&f);
	ACCEPTED(flags_check(&f, err, sizeof(err)));
	CHECK(!flags_want_container(&f));
	ACCEPTED(set_mounts(&f, "/a:/b", err, sizeof(err)));
	REFUSED(flags_check(&f, err, sizeof(err)),
		"--container-mounts needs --container-image or --container-name");
	ACCEPTED(set_name(&f, "n", err, sizeof(err)));
	ACCEPTED(flags_check(&f, err, sizeof(err)));
	CHECK(flags_want_container(&f));
	flags_free(&f);
	CHECK(f.name == NULL && f.mounts == NULL && f.writable == UNSET);

	ACCEPTED(set_unshare(&f, "ipc", err, sizeof(err)));
	REFUSED(flags_check(&f, err, sizeof(err)), "--container-unshare needs");
	flags_free(&f);
	ACCEPTED(set_devices(&f, "vendor.example/gpu=0", err, sizeof(err)));
	REFUSED(flags_check(&f, err, sizeof(err)),
		"--container-device needs --container-image or --container-name");
	flags_free(&f);
}

static void test_edf(void)
{
	struct container_flags f;
	const char *text = "environment=pytorch\nimage=nvcr.io#nvidia/pytorch:24.01\n"
			   "workdir=/workspace\nwritable=yes\nentrypoint=no\n"
			   "mount=/scratch:/scratch\nmount=/home:/home:ro\n"
			   "env=CONFDIR=/workspace/conf\nhook_env=BERTH_HOOK_PMIX_ENABLE=1\n";
	const char *body = edf_body(text, "pytorch");

	CHECK(body != NULL && strncmp(body, "image=", 6) == 0);
	CHECK(edf_body(text, "pytorc") == NULL);
	CHECK(edf_body(text, "other") == NULL);
	CHECK(edf_body("image=x\n", "x") == NULL);

	/* alone, the EDF gives every value */
	flags_init(&f);
	ACCEPTED(set_environment(&f, "pytorch", err, sizeof(err)));
	ACCEPTED(apply_edf(&f, body, 0, err, sizeof(err)));
	CHECK(f.image && strcmp(f.image, "nvcr.io#nvidia/pytorch:24.01") == 0);
	CHECK(f.workdir && strcmp(f.workdir, "/workspace") == 0);
	CHECK(f.mounts && strcmp(f.mounts, "/scratch:/scratch,/home:/home:ro") == 0);
	CHECK(f.env_set && strcmp(f.env_set, "CONFDIR=/workspace/conf") == 0);
	CHECK(f.hook_env && strcmp(f.hook_env, "BERTH_HOOK_PMIX_ENABLE=1") == 0);
	CHECK(f.writable == ON && f.entrypoint == OFF);
	ACCEPTED(flags_check(&f, err, sizeof(err)));
	flags_free(&f);

	/* flags beat it; its mounts come before the flag's */
	ACCEPTED(set_environment(&f, "pytorch", err, sizeof(err)));
	ACCEPTED(set_image(&f, "ubuntu:24.04", 0, err, sizeof(err)));
	ACCEPTED(set_workdir(&f, "/tmp", err, sizeof(err)));
	ACCEPTED(set_mounts(&f, "/data:/data", err, sizeof(err)));
	f.writable = OFF;
	ACCEPTED(apply_edf(&f, body, 0, err, sizeof(err)));
	CHECK(strcmp(f.image, "ubuntu:24.04") == 0 && strcmp(f.workdir, "/tmp") == 0);
	CHECK(strcmp(f.mounts, "/scratch:/scratch,/home:/home:ro,/data:/data") == 0);
	CHECK(f.writable == OFF);
	flags_free(&f);

	/* bad values are refused like the flags, naming the environment */
	ACCEPTED(set_environment(&f, "e", err, sizeof(err)));
	REFUSED(apply_edf(&f, "image=/no/such.sqsh\n", 1, err, sizeof(err)),
		"--environment: e: --container-image: no such file '/no/such.sqsh'");
	REFUSED(apply_edf(&f, "mount=:/a\n", 0, err, sizeof(err)), "missing source");
	REFUSED(apply_edf(&f, "mount=/a,b:/b\n", 0, err, sizeof(err)), "has a ','");
	REFUSED(apply_edf(&f, "mount=/a:mnt\n", 0, err, sizeof(err)),
		"mount target must be a relative path or an absolute path, in '/a:mnt'");
	REFUSED(apply_edf(&f, "writable=maybe\n", 0, err, sizeof(err)), "not yes or no");
	REFUSED(apply_edf(&f, "env=NOVALUE\n", 0, err, sizeof(err)), "not KEY=VALUE");
	REFUSED(apply_edf(&f, "colour=blue\n", 0, err, sizeof(err)), "unexpected line");
	REFUSED(apply_edf(&f, "hook_env==1\n", 0, err, sizeof(err)), "not KEY=VALUE");
	CHECK(f.image == NULL && f.mounts == NULL && f.env_set == NULL && f.hook_env == NULL);
	/* its devices: CDI names, one a line, for berth start --device */
	ACCEPTED(apply_edf(&f, "device=vendor.example/nic=nic0\ndevice=vendor.example/gpu=g0\n",
			   0, err, sizeof(err)));
	CHECK(f.devices && strcmp(f.devices, "vendor.example/nic=nic0\nvendor.example/gpu=g0") == 0);
	flags_free(&f);
	ACCEPTED(set_environment(&f, "e", err, sizeof(err)));
	REFUSED(apply_edf(&f, "device=nic0\n", 0, err, sizeof(err)),
		"device: 'nic0' is not a CDI device name");
	CHECK(f.devices == NULL);
	/* --container-device: a comma list, one a line; after the EDF's */
	ACCEPTED(set_devices(&f, "vendor.example/gpu=0,vendor.example/gpu=1", err, sizeof(err)));
	CHECK(strcmp(f.devices, "vendor.example/gpu=0\nvendor.example/gpu=1") == 0);
	ACCEPTED(apply_edf(&f, "device=vendor.example/nic=nic0\n", 0, err, sizeof(err)));
	CHECK(strcmp(f.devices, "vendor.example/nic=nic0\nvendor.example/gpu=0\n"
			     "vendor.example/gpu=1") == 0);
	REFUSED(set_devices(&f, "vendor.example/gpu=0,gpu1", err, sizeof(err)),
		"--container-device: 'gpu1' is not a CDI device name (VENDOR/CLASS=NAME, "
		"as nvidia.com/gpu=0)");
	REFUSED(set_devices(&f, "", err, sizeof(err)), "'' is not a CDI device name");
	REFUSED(set_devices(&f, "a/b=c,", err, sizeof(err)), "'' is not a CDI device name");
	REFUSED(set_devices(&f, "/b=c", err, sizeof(err)), "'/b=c' is not a CDI device name");
	REFUSED(set_devices(&f, "a/b/c=d", err, sizeof(err)), "'a/b/c=d' is not");
	REFUSED(set_devices(&f, "a/b=c d", err, sizeof(err)), "'a/b=c d' is not");
	CHECK(strncmp(f.devices, "vendor.example/nic=nic0\n", 24) == 0); /* kept as it was */
	flags_free(&f);
	ACCEPTED(set_environment(&f, "e", err, sizeof(err)));
	/* a warning line (submit_environment prints it) sets nothing */
	ACCEPTED(apply_edf(&f, "warning=e.toml: annotation 'com.hooks.cxi.enable' is for hook "
			   "'cxi', which is not installed: left out\n", 0, err, sizeof(err)));
	CHECK(f.image == NULL && f.mounts == NULL && f.env_set == NULL && f.hook_env == NULL);
	/* an EDF without an image needs --container-image */
	ACCEPTED(apply_edf(&f, "workdir=/w\n", 0, err, sizeof(err)));
	REFUSED(flags_check(&f, err, sizeof(err)),
		"--environment: 'e' sets no image and no --container-image is given");
	flags_free(&f);
	REFUSED(set_environment(&f, "", err, sizeof(err)), "--environment: empty name");
}

static int wins(const char *key, int task_has, const char *names)
{
	return container_value_wins(key, strlen(key), task_has, names);
}

static int dropped(const char *key, const char *names)
{
	return task_value_dropped(key, strlen(key), names);
}

static void test_env_merge(void)
{
	/* the image's value is copied over the task's */
	CHECK(wins("CUDA_HOME", 0, NULL) == 1);
	CHECK(wins("HOME", 1, NULL) == 1);
	CHECK(wins("PATH", 1, "PATHX") == 1);
	/* except what --container-env names, when the task has it */
	CHECK(wins("HOME", 1, "X,HOME") == 0);
	CHECK(wins("LD_LIBRARY_PATH", 1, "X,LD_LIBRARY_PATH") == 0);
	CHECK(wins("HOME", 0, "HOME") == 1);
	/* Slurm and PMI variables only ever come from the task */
	CHECK(wins("SLURM_JOB_ID", 0, NULL) == 0);
	CHECK(wins("PMIX_RANK", 1, NULL) == 0);
	CHECK(wins("PMI_FD", 0, NULL) == 0);
	CHECK(wins("PMIXX", 0, NULL) == 1);
	/* the submitting host's locale leaves the task unless named */
	CHECK(dropped("LANG", NULL) && dropped("LANGUAGE", "X") && dropped("LC_ALL", "LANG"));
	CHECK(!dropped("LANG", "X,LANG") && !dropped("LC_CTYPE", NULL) && !dropped("LAN", NULL));
}

#define DIGEST "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* The runtime's answer (answer.c): what berth import and start --porcelain print. */
static void test_answer(void)
{
	struct answer a;

	answer_init(&a);
	ACCEPTED(answer_parse("squashfs=/cache/a%20b%0Ac%3D.sqsh digest=" DIGEST " cached=no\n",
			      &a, err, sizeof(err)));
	CHECK(strcmp(a.squashfs, "/cache/a b\nc=.sqsh") == 0 && strcmp(a.digest, DIGEST) == 0);
	CHECK(ANSWER_HAS(&a, squashfs) && ANSWER_HAS(&a, digest) && ANSWER_HAS(&a, cached) &&
	      !ANSWER_HAS(&a, pid) && a.cached == 0);
	/* start --detach: the digest line, then the pid line, into one answer */
	answer_init(&a);
	ACCEPTED(answer_parse("digest=sha256%3A0123456789abcdef0123456789abcdef0123456789abcdef"
			      "0123456789abcdef cached=yes future=x%20y\n", &a, err, sizeof(err)));
	CHECK(a.cached == 1 && strcmp(a.digest, DIGEST) == 0 && !ANSWER_HAS(&a, pid));
	ACCEPTED(answer_parse("pid=4242", &a, err, sizeof(err)));
	CHECK(a.pid == 4242 && a.cached == 1);
	/* refused whole: a is as it was */
	REFUSED(answer_parse("pid=1", &a, err, sizeof(err)), "gives pid twice");
	CHECK(a.pid == 4242);
	answer_init(&a);
	REFUSED(answer_parse("cached=yes pid=12x", &a, err, sizeof(err)), "pid is no process id");
	CHECK(a.given == 0);
	REFUSED(answer_parse("pid=0", &a, err, sizeof(err)), "pid is no process id");
	REFUSED(answer_parse("pid=", &a, err, sizeof(err)), "pid is no process id");
	REFUSED(answer_parse("pid=99999999999999999999", &a, err, sizeof(err)), "no process id");
	REFUSED(answer_parse("squashfs=cache/x", &a, err, sizeof(err)), "not an absolute path");
	REFUSED(answer_parse("squashfs=/a%00b", &a, err, sizeof(err)), "not percent-encoded");
	REFUSED(answer_parse("squashfs=/a b", &a, err, sizeof(err)), "no KEY=VALUE line");
	REFUSED(answer_parse("squashfs=/a\tb", &a, err, sizeof(err)), "not percent-encoded");
	REFUSED(answer_parse("squashfs=/a%2", &a, err, sizeof(err)), "not percent-encoded");
	REFUSED(answer_parse("squashfs=/a\npid=1\n", &a, err, sizeof(err)), "more than one line");
	REFUSED(answer_parse("digest=sha256:0123", &a, err, sizeof(err)), "no sha256 digest");
	REFUSED(answer_parse("digest=" DIGEST "0", &a, err, sizeof(err)), "no sha256 digest");
	REFUSED(answer_parse("cached=maybe", &a, err, sizeof(err)), "neither yes nor no");
	REFUSED(answer_parse("", &a, err, sizeof(err)), "no KEY=VALUE line");
	REFUSED(answer_parse("\n", &a, err, sizeof(err)), "no KEY=VALUE line");
	REFUSED(answer_parse("pid=1 ", &a, err, sizeof(err)), "no KEY=VALUE line");
	REFUSED(answer_parse("=1", &a, err, sizeof(err)), "no KEY=VALUE line");
	REFUSED(answer_parse("sha256:" DIGEST, &a, err, sizeof(err)), "no KEY=VALUE line");
	CHECK(a.given == 0);
	{
		/* a value (here a path) of PATH_MAX - 1 bytes fits, not one more */
		static char long_line[9 + PATH_MAX + 1];

		memcpy(long_line, "squashfs=/", 10);
		memset(long_line + 10, 'a', PATH_MAX - 1);
		REFUSED(answer_parse(long_line, &a, err, sizeof(err)), "too long");
		long_line[9 + PATH_MAX - 1] = '\0';
		ACCEPTED(answer_parse(long_line, &a, err, sizeof(err)));
		CHECK(strlen(a.squashfs) == PATH_MAX - 1);
	}
}

int main(void)
{
	struct container_flags f;

	test_conf();
	test_table_defaults();
	test_bool();
	flags_init(&f);
	test_image(&f);
	test_mounts(&f);
	test_name(&f);
	test_other_flags(&f);
	flags_free(&f);
	test_image_names();
	test_image_pin();
	test_flags_check();
	test_env_merge();
	test_switches();
	test_pyxis_env();
	test_edf();
	test_answer();
	if (failures) {
		printf("%d check(s) failed\n", failures);
		return 1;
	}
	printf("all option tests passed\n");
	return 0;
}
