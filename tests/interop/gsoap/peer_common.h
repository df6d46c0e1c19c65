/*
  peer_common.h -- what the gSOAP interop server and client share.

  The peer is a test fixture: it exists so the project's WS-RM code can be
  checked against an implementation it did not write.  Everything protocol-
  related is left to gSOAP's own wsrm/wsa plugins; this code only adds the
  application side (deliver a Note to a file, answer an Echo) and the glue a
  Python test needs (command-line options, machine-readable output).
*/
#ifndef PEER_COMMON_H
#define PEER_COMMON_H

#include "wsrm_compat.h"

#include <stdio.h>

#define PEER_NS             "http://example.org/wsrm-interop"
#define PEER_ACTION_NOTE    PEER_NS "/Note"
#define PEER_ACTION_ECHO    PEER_NS "/Echo"
#define PEER_ACTION_ECHO_RESPONSE PEER_NS "/EchoResponse"

#ifdef SOAP_WSRM_2005
# define PEER_WSRM_VERSION "1.0"
#else
# define PEER_WSRM_VERSION "1.1"
#endif

/* stderr log line "[gsoap-<role> wsrm-<version>] ...", flushed at once so a
   test that fails can show what the peer saw. */
void peer_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void peer_set_role(const char *role);

/* Writes s with backslash escapes for '\\', '\t', '\n', '\r' so one message
   is always one line; NULL is written as the empty string. */
void peer_write_escaped(FILE *fd, const char *s);

/* A context with the WS-Addressing and WS-RM plugins registered.
   soap_version: 1 (SOAP 1.1) or 2 (SOAP 1.2) for messages this context
   originates; a server context replies in the version of each request
   (give it 1: the generated table, which accepts both). */
struct soap *peer_new_context(int soap_version, int timeout_s);

/* True for the WS-Addressing 2005/08 and 2004/08 anonymous addresses (and NULL). */
int peer_is_anonymous(const char *address);
/* True for the WS-Addressing 2005/08 "none" address. */
int peer_is_none(const char *address);

/* Splits http://host:port/... into host and port (port 80 when absent).
   Returns 0 on success. */
int peer_parse_http_url(const char *url, char *host, size_t hostlen, int *port);

/* Logs the fault the context holds (after a failed call or serve). */
void peer_log_fault(struct soap *soap, const char *what);

#endif
