/* The assembly (this folder: server.c, server_type.c, httpmodule.c): the
 * tables through which each layer reaches the one above it, the Server's
 * Python type, the module. Only the assembly names these.
 */
#ifndef SOCKHERD_ASSEMBLY_H
#define SOCKHERD_ASSEMBLY_H

#include "engine.h"

extern PyTypeObject ServerType;            /* server_type.c */
extern PyMethodDef server_asgi_methods[];  /* server.c: set_aio */
/* server.c: a new Server's tables (WSGI over HTTP/1) and the type's
 * attributes, named by the type (server_type.c) */
extern const struct conn_ops h1_conn_ops;
extern const struct app_ops wsgi_app_ops;
extern PyGetSetDef Server_getset[];

#endif /* SOCKHERD_ASSEMBLY_H */
