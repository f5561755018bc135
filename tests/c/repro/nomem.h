/* Out of memory on demand for the tests/c/repro/ programs linked with
 * -Wl,--wrap=realloc: the core's realloc calls (owe(), poller_owed.c) come here
 * and fail while g_nomem is set, or for the next g_fail_left calls (memory
 * coming back after that many more failures); g_failed counts failures.
 * Header-only, included by one file of each program: each repro is its own
 * program. */
#ifndef REPRO_NOMEM_H
#define REPRO_NOMEM_H

#include <stddef.h>

static int g_nomem, g_fail_left, g_failed;

void *__real_realloc(void *p, size_t n);

void *__wrap_realloc(void *p, size_t n)
{
	if (g_nomem || g_fail_left > 0) {
		if (g_fail_left > 0)
			g_fail_left--;
		g_failed++;
		return NULL;
	}
	return __real_realloc(p, n);
}

#endif
