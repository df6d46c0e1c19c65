/* WS-ReliableMessaging 1.0 (wsrm 2005/02) + WS-Addressing 2005/08 build of echo.h.
   Needs wsrm_compat.h when compiling (see there). */
#import "wsrm5.h"
#import "echo.h"
