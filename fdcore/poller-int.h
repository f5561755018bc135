/* sockherd fdcore: what the poller's files share (poller.c, poller_update.c,
 * poller_owed.c, poller_accept.c). Not part of the API: nothing outside
 * fdcore includes this file, and the symbols are hidden (no PLT call, none
 * exported from the module), as when they were one file's statics. Each
 * function's contract (who may call it, ordering) is in the comment above
 * its definition.
 */
#ifndef SOCKHERD_POLLER_INT_H
#define SOCKHERD_POLLER_INT_H

#include <sys/epoll.h>

#include "fd-int.h"

#define FDC_HIDDEN __attribute__((visibility("hidden")))

/* poller_update.c */
FDC_HIDDEN int ctl(struct fdc_thread *th, int op, int fd, struct epoll_event *ev, int *err);
FDC_HIDDEN void set_polled(struct fdc_polled *pol, uint64_t bit, int r, int h, int w);

/* poller_owed.c */
FDC_HIDDEN int owe(struct fdc_thread *th, int fd, uint32_t gen, uint32_t events);
FDC_HIDDEN void retry_later(struct fdc_thread *th, int fd, uint8_t why);
FDC_HIDDEN void fail_fd(struct fdc_thread *th, int fd, int err);
FDC_HIDDEN void take_kept(struct fdc_thread *th, int fd);

#endif /* SOCKHERD_POLLER_INT_H */
