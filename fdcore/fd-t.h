#ifndef SOCKHERD_FD_T_H
#define SOCKHERD_FD_T_H
#endif
