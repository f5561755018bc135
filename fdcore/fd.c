#include "fd.h"
const char *fdc_version(void) { return "0"; }
