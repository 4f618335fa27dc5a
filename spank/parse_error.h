/*
 * How the checks of plugstack options and --container-* values report: a
 * function that fails writes one line into err (naming the key or flag and
 * the bad value) and returns -1; 0 means success. Nothing here calls Slurm,
 * so spank/tests/test_options.c exercises those checks directly.
 */
#ifndef BERTH_SPANK_PARSE_ERROR_H
#define BERTH_SPANK_PARSE_ERROR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#define ERR_LEN 512

/* One line into err; -1, for "return fail(...)". */
static inline __attribute__((format(printf, 3, 4)))
int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

#endif
