/* See answer.h. */
#include "answer.h"

#include <string.h>

void answer_init(struct answer *a)
{
	memset(a, 0, sizeof(*a));
}

/* A byte written as it is: ASCII letters and digits and "-._~/:@" (not the locale's). */
static int plain(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c != '\0' && strchr("-._~/:@", c) != NULL);
}

static int hex_digit(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The kinds of answer_keys.h: value checked and stored. */
static int read_path(const char *key, const char *value, char *out, size_t outlen,
		     char *err, size_t errlen)
{
	size_t len = strlen(value);

	if (value[0] != '/')
		return fail(err, errlen, "the runtime's answer: %s is not an absolute path", key);
	if (len >= outlen)
		return fail(err, errlen, "the runtime's answer: %s is too long", key);
	memcpy(out, value, len + 1);
	return 0;
}

static int read_digest(const char *key, const char *value, char *out, size_t outlen,
		       char *err, size_t errlen)
{
	if (strncmp(value, "sha256:", 7) != 0 || strlen(value) != 71 ||
	    strspn(value + 7, "0123456789abcdef") != 64 || outlen < 72)
		return fail(err, errlen, "the runtime's answer: %s is no sha256 digest", key);
	memcpy(out, value, 72);
	return 0;
}

static int read_yesno(const char *key, const char *value, int *out, char *err, size_t errlen)
{
	if (strcmp(value, "yes") != 0 && strcmp(value, "no") != 0)
		return fail(err, errlen, "the runtime's answer: %s is neither yes nor no", key);
	*out = value[0] == 'y';
	return 0;
}

static int read_pid(const char *key, const char *value, pid_t *out, char *err, size_t errlen)
{
	long long pid = 0;

	for (const char *p = value; *p >= '0' && *p <= '9' && pid <= 0x7fffffff; p++)
		pid = pid * 10 + (*p - '0');
	if (value[0] == '\0' || value[0] == '0' || strspn(value, "0123456789") != strlen(value) ||
	    pid > 0x7fffffff)
		return fail(err, errlen, "the runtime's answer: %s is no process id", key);
	*out = (pid_t)pid;
	return 0;
}

#define READ_path(key)   read_path(#key, value, a->key, sizeof(a->key), err, errlen)
#define READ_digest(key) read_digest(#key, value, a->key, sizeof(a->key), err, errlen)
#define READ_yesno(key)  read_yesno(#key, value, &a->key, err, errlen)
#define READ_pid(key)    read_pid(#key, value, &a->key, err, errlen)

/* name (namelen bytes) = value into a; a key of a newer runtime is passed over. */
static int store(struct answer *a, const char *name, size_t namelen, const char *value,
		 char *err, size_t errlen)
{
#define ANSWER_KEY(key, kind)                                                              \
	if (namelen == sizeof(#key) - 1 && strncmp(name, #key, namelen) == 0) {           \
		if (ANSWER_HAS(a, key))                                                     \
			return fail(err, errlen, "the runtime's answer gives %s twice", #key); \
		if (READ_##kind(key) < 0)                                                   \
			return -1;                                                          \
		a->given |= 1u << ANSWER_BIT_##key;                                         \
		return 0;                                                                   \
	}
#include "answer_keys.h"
#undef ANSWER_KEY
	return 0;
}

int answer_parse(const char *line, struct answer *a, char *err, size_t errlen)
{
	struct answer next = *a; /* a is changed only by a whole line read */
	char value[PATH_MAX];
	const char *p = line;

	for (;;) {
		const char *name = p;
		size_t namelen = strcspn(p, "= \n"), len = 0;

		if (namelen == 0 || p[namelen] != '=')
			return fail(err, errlen, "the runtime's answer is no KEY=VALUE line");
		for (p += namelen + 1; *p != ' ' && *p != '\n' && *p != '\0'; len++) {
			int hi = *p == '%' ? hex_digit(p[1]) : -1;
			int lo = hi >= 0 ? hex_digit(p[2]) : -1;

			if (len + 1 >= sizeof(value))
				return fail(err, errlen, "a value of the runtime's answer is too long");
			if (lo >= 0 && (hi || lo)) { /* %00 would cut the value short */
				value[len] = (char)(hi * 16 + lo);
				p += 3;
			} else if (plain(*p))
				value[len] = *p++;
			else
				return fail(err, errlen, "the runtime's answer has a byte that is not "
					    "percent-encoded");
		}
		value[len] = '\0';
		if (store(&next, name, namelen, value, err, errlen) < 0)
			return -1;
		if (*p == ' ')
			p++;
		else if (*p == '\0' || (*p == '\n' && p[1] == '\0'))
			break;
		else
			return fail(err, errlen, "the runtime's answer is more than one line");
	}
	*a = next;
	return 0;
}
