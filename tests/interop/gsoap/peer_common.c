/*
  peer_common.c -- shared helpers of the gSOAP interop server and client.
  See peer_common.h.
*/
#include "peer_common.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The namespace table soapcpp2 wrote for echo.h (one per WS-RM version). */
#include "Echo.nsmap"

static const char *peer_role = "peer";

void peer_set_role(const char *role)
{
  peer_role = role;
}

void peer_log(const char *fmt, ...)
{
  va_list ap;
  fprintf(stderr, "[gsoap-%s wsrm-%s] ", peer_role, PEER_WSRM_VERSION);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

void peer_write_escaped(FILE *fd, const char *s)
{
  if (!s)
    return;
  for (; *s; s++)
  {
    switch (*s)
    {
      case '\\': fputs("\\\\", fd); break;
      case '\t': fputs("\\t", fd); break;
      case '\n': fputs("\\n", fd); break;
      case '\r': fputs("\\r", fd); break;
      default: fputc(*s, fd);
    }
  }
}

/* The generated table puts SOAP 1.1 first (and accepts 1.2 through the
   pattern column).  soap_set_version() does not survive soap_begin(), which
   every generated call runs, so SOAP 1.2 gets its own table: 1.2 written,
   1.1 still accepted in replies. */
static struct Namespace *soap12_namespaces(void)
{
  static struct Namespace *table;
  size_t n = 0;
  if (table)
    return table;
  while (namespaces[n].id)
    n++;
  table = (struct Namespace*)calloc(n + 1, sizeof(struct Namespace));
  if (!table)
    return namespaces;
  memcpy(table, namespaces, (n + 1) * sizeof(struct Namespace));
  table[0].ns = "http://www.w3.org/2003/05/soap-envelope";
  table[0].in = "http://schemas.xmlsoap.org/soap/envelope/";
  table[1].ns = "http://www.w3.org/2003/05/soap-encoding";
  table[1].in = "http://schemas.xmlsoap.org/soap/encoding/";
  return table;
}

struct soap *peer_new_context(int soap_version, int timeout_s)
{
  struct soap *soap = soap_new1(SOAP_IO_KEEPALIVE | SOAP_C_UTFSTRING);
  if (!soap)
    return NULL;
  soap_set_namespaces(soap, soap_version == 2 ? soap12_namespaces() : namespaces);
  if (soap_register_plugin(soap, soap_wsa) || soap_register_plugin(soap, soap_wsrm))
  {
    peer_log_fault(soap, "registering the wsa/wsrm plugins");
    soap_free(soap);
    return NULL;
  }
  soap->connect_timeout = timeout_s;
  soap->send_timeout = timeout_s;
  soap->recv_timeout = timeout_s;
  return soap;
}

int peer_is_anonymous(const char *address)
{
  return !address
      || !strcmp(address, "http://www.w3.org/2005/08/addressing/anonymous")
      || !strcmp(address, "http://schemas.xmlsoap.org/ws/2004/08/addressing/role/anonymous");
}

int peer_is_none(const char *address)
{
  return address && !strcmp(address, "http://www.w3.org/2005/08/addressing/none");
}

int peer_parse_http_url(const char *url, char *host, size_t hostlen, int *port)
{
  const char *p, *end, *colon;
  size_t n;
  if (strncmp(url, "http://", 7))
    return -1;
  p = url + 7;
  end = p + strcspn(p, "/?#");
  colon = NULL;
  if (*p == '[')
  {
    /* [v6-address]:port */
    const char *close = memchr(p, ']', (size_t)(end - p));
    if (!close)
      return -1;
    n = (size_t)(close - p - 1);
    if (n + 1 > hostlen)
      return -1;
    memcpy(host, p + 1, n);
    host[n] = '\0';
    colon = (close + 1 < end && close[1] == ':') ? close + 1 : NULL;
  }
  else
  {
    colon = memchr(p, ':', (size_t)(end - p));
    n = (size_t)((colon ? colon : end) - p);
    if (n == 0 || n + 1 > hostlen)
      return -1;
    memcpy(host, p, n);
    host[n] = '\0';
  }
  *port = 80;
  if (colon)
  {
    char *stop;
    long v = strtol(colon + 1, &stop, 10);
    if (stop != end || v <= 0 || v > 65535)
      return -1;
    *port = (int)v;
  }
  return 0;
}

void peer_log_fault(struct soap *soap, const char *what)
{
  const char *code = NULL, *subcode = NULL, *reason = NULL, *detail = NULL;
  if (soap->error)
  {
    soap_set_fault(soap);
    code = *soap_faultcode(soap);
    subcode = soap_fault_subcode(soap);
    reason = soap_fault_string(soap);
    detail = soap_fault_detail(soap);
  }
  peer_log("%s: error %d code=%s subcode=%s reason=%s detail=%s",
           what, soap->error,
           code ? code : "-", subcode ? subcode : "-",
           reason ? reason : "-", detail ? detail : "-");
}

/*
  A SOAP Fault sent to us as a one-way message (wsa:FaultTo pointed here).
  WS-RM faults carry the sequence Identifier in the detail: the sequence is
  then marked faulted, so the client stops and reports instead of retrying.
*/
int SOAP_ENV__Fault(struct soap *soap,
                    char *faultcode, char *faultstring, char *faultactor,
                    struct SOAP_ENV__Detail *detail,
                    struct SOAP_ENV__Code *SOAP_ENV__Code,
                    struct SOAP_ENV__Reason *SOAP_ENV__Reason,
                    char *SOAP_ENV__Node, char *SOAP_ENV__Role,
                    struct SOAP_ENV__Detail *SOAP_ENV__Detail)
{
  const char *reason = faultstring;
  const char *code = faultcode;
  (void)faultactor; (void)SOAP_ENV__Node; (void)SOAP_ENV__Role;
  if (!reason && SOAP_ENV__Reason)
    reason = SOAP_ENV__Reason->SOAP_ENV__Text;
  if (!code && SOAP_ENV__Code)
  {
    code = SOAP_ENV__Code->SOAP_ENV__Value;
    if (SOAP_ENV__Code->SOAP_ENV__Subcode && SOAP_ENV__Code->SOAP_ENV__Subcode->SOAP_ENV__Value)
      code = SOAP_ENV__Code->SOAP_ENV__Subcode->SOAP_ENV__Value;
  }
  peer_log("received a one-way SOAP Fault: code=%s reason=%s", code ? code : "-", reason ? reason : "-");
  soap_send_empty_response(soap, 202);
  if (!detail)
    detail = SOAP_ENV__Detail;
  if (detail && detail->__type == SOAP_TYPE__wsrm__Identifier && detail->fault)
  {
    soap_wsrm_sequence_handle seq = soap_wsrm_seq_lookup_id(soap, (const char*)detail->fault);
    if (seq)
    {
      soap_wsrm_error(soap, seq, wsrm__SequenceTerminated);
      soap_wsrm_seq_release(soap, seq);
    }
  }
  return SOAP_OK;
}
