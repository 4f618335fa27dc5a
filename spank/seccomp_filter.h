/*
 * The seccomp filter of every container process (runtime/berth/container/seccomp.py):
 * tasks join the container with setns, so they are no children of its
 * keeper and install the same filter themselves. Made by
 *   python3 -m berth.container.seccomp x86_64; python3 -m berth.container.seccomp aarch64
 * and held equal to those by tests/test_spank_plugin.py.
 */
#ifndef BERTH_SECCOMP_FILTER_H
#define BERTH_SECCOMP_FILTER_H

#include <linux/filter.h>

#if defined(__x86_64__)
#define BERTH_HAVE_SECCOMP_FILTER 1
static const struct sock_filter seccomp_filter[] = {
	{ 0x20, 0, 0, 0x00000004 },
	{ 0x15, 0, 19, 0xc000003e },
	{ 0x20, 0, 0, 0x00000000 },
	{ 0x54, 0, 0, 0xbfffffff },
	{ 0x15, 15, 0, 0x0000005c },
	{ 0x15, 14, 0, 0x0000005d },
	{ 0x15, 13, 0, 0x0000005e },
	{ 0x15, 12, 0, 0x00000069 },
	{ 0x15, 11, 0, 0x0000006a },
	{ 0x15, 10, 0, 0x00000071 },
	{ 0x15, 9, 0, 0x00000072 },
	{ 0x15, 8, 0, 0x00000074 },
	{ 0x15, 7, 0, 0x00000075 },
	{ 0x15, 6, 0, 0x00000077 },
	{ 0x15, 5, 0, 0x00000104 },
	{ 0x15, 2, 0, 0x0000007a },
	{ 0x15, 1, 0, 0x0000007b },
	{ 0x06, 0, 0, 0x7fff0000 },
	{ 0x20, 0, 0, 0x00000010 },
	{ 0x15, 1, 0, 0xffffffff },
	{ 0x06, 0, 0, 0x00050000 },
	{ 0x06, 0, 0, 0x7fff0000 },
};
#elif defined(__aarch64__)
#define BERTH_HAVE_SECCOMP_FILTER 1
static const struct sock_filter seccomp_filter[] = {
	{ 0x20, 0, 0, 0x00000004 },
	{ 0x15, 0, 16, 0xc00000b7 },
	{ 0x20, 0, 0, 0x00000000 },
	{ 0x15, 13, 0, 0x00000036 },
	{ 0x15, 12, 0, 0x00000037 },
	{ 0x15, 11, 0, 0x0000008f },
	{ 0x15, 10, 0, 0x00000090 },
	{ 0x15, 9, 0, 0x00000091 },
	{ 0x15, 8, 0, 0x00000092 },
	{ 0x15, 7, 0, 0x00000093 },
	{ 0x15, 6, 0, 0x00000095 },
	{ 0x15, 5, 0, 0x0000009f },
	{ 0x15, 2, 0, 0x00000097 },
	{ 0x15, 1, 0, 0x00000098 },
	{ 0x06, 0, 0, 0x7fff0000 },
	{ 0x20, 0, 0, 0x00000010 },
	{ 0x15, 1, 0, 0xffffffff },
	{ 0x06, 0, 0, 0x00050000 },
	{ 0x06, 0, 0, 0x7fff0000 },
};
#endif /* other architectures: no filter, as in the runtime */

#endif
