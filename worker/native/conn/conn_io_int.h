/* What the connection layer's I/O files share (conn_io.c,
 * conn_events.c) beyond conn.h: not part of the layer's interface, only
 * those two include it.
 */
#ifndef SOCKHERD_CONN_IO_INT_H
#define SOCKHERD_CONN_IO_INT_H

#include "server.h"

/* conn_io.c: a lingering connection's input read and dropped (its end
 * closes it) */
void discard(struct conn *c);

#endif /* SOCKHERD_CONN_IO_INT_H */
