#include "fd.h"
