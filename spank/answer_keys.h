/*
 * The runtime's --porcelain keys, one ANSWER_KEY(key, kind) a line:
 * written by scripts/answer_keys.py from their one table,
 * runtime/berth/porcelain.py's KEYS (do not edit). answer.h makes
 * struct answer's fields of it and answer.c its parser. No include
 * guard: each user defines ANSWER_KEY and includes it.
 */
/* the image cache's squashfs of the URI (import --cache-only) */
ANSWER_KEY(squashfs, path)
/* the digest the image was pulled by */
ANSWER_KEY(digest, digest)
/* yes: the image was there already, nothing was downloaded */
ANSWER_KEY(cached, yesno)
/* the container's pid, once it is ready (start --detach): its own line */
ANSWER_KEY(pid, pid)
