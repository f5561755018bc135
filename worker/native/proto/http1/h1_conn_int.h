/* What the HTTP/1 codec's connection files share (h1_conn.c, h1_timers.c)
 * beyond h1.h: not part of the codec's interface, only those two include
 * it.
 */
#ifndef SOCKHERD_H1_CONN_INT_H
#define SOCKHERD_H1_CONN_INT_H

#include "h1.h"

/* h1_timers.c: a held request's body, or one a call streams, moved on by
 * n bytes: its deadline moves back n / min_body_rate seconds */
void body_progress(struct conn *c, size_t n);
void call_body_progress(struct conn *c, size_t n);

#endif /* SOCKHERD_H1_CONN_INT_H */
