/*
 * The runtime's answer to the plugin ("--porcelain"): one line of KEY=VALUE
 * pairs, single spaces between them, each value percent-encoded (%XX for
 * any byte but letters, digits and "-._~/:@"). The keys: answer_keys.h.
 * "berth import --cache-only --porcelain" prints squashfs, digest and
 * cached; "berth start --detach --porcelain" a line of digest and cached
 * for a URI target once the image is there, then a line of pid when the
 * container is ready.
 */
#ifndef BERTH_SPANK_ANSWER_H
#define BERTH_SPANK_ANSWER_H

#include "parse_error.h"

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

#pragma GCC visibility push(hidden) /* the plugin's own: see step.h */

/* One field per line of answer_keys.h, named as its key, and a bit saying it was given. */
#define ANSWER_FIELD_path(key)   char key[PATH_MAX];
#define ANSWER_FIELD_digest(key) char key[72]; /* sha256: and 64 hex digits */
#define ANSWER_FIELD_yesno(key)  int key;
#define ANSWER_FIELD_pid(key)    pid_t key;
struct answer {
#define ANSWER_KEY(key, kind) ANSWER_FIELD_##kind(key)
#include "answer_keys.h"
#undef ANSWER_KEY
	unsigned given; /* ANSWER_<KEY> bits of the keys read so far */
};
#undef ANSWER_FIELD_path
#undef ANSWER_FIELD_digest
#undef ANSWER_FIELD_yesno
#undef ANSWER_FIELD_pid

enum {
#define ANSWER_KEY(key, kind) ANSWER_BIT_##key,
#include "answer_keys.h"
#undef ANSWER_KEY
};
#define ANSWER_HAS(a, key) (((a)->given >> ANSWER_BIT_##key) & 1u)

/* An answer with nothing read yet. */
void answer_init(struct answer *a);
/*
 * Read one line (its newline, if any, ends it) into a: 0, or -1 and why in
 * err (a is then left as it was). A key given twice, a bad value or a
 * malformed pair is refused; a key not in answer_keys.h (a newer runtime's)
 * is passed over.
 */
int answer_parse(const char *line, struct answer *a, char *err, size_t errlen);

#pragma GCC visibility pop

#endif
