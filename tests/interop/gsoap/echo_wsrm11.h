/* WS-ReliableMessaging 1.1 (wsrm 200702) + WS-Addressing 2005/08 build of echo.h. */
#import "wsrm.h"
#import "echo.h"
