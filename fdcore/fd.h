#ifndef SOCKHERD_FD_H
#define SOCKHERD_FD_H
#include "fd-t.h"
const char *fdc_version(void);
#endif
