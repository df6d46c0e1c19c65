/*
  server.c -- a WS-RM destination built from gSOAP's wsrm plugin.

  Usage:
    gsoap-wsrm-server --deliveries FILE [--host 127.0.0.1] [--port 0]
                      [--hold-ms 2000] [--pulse-ms 0] [--timeout-s 30]

  Prints "READY <port>" on stdout once it listens, then serves until killed.
  Every message handed to the application (each Note and Echo accepted by the
  plugin) is appended to FILE as one line, flushed at once:

      <operation> TAB <sequence id> TAB <message number> TAB <escaped text>

  (text escaped as in peer_write_escaped).  A test reads that file to check
  exactly-once, in-order delivery.

  What is stock gSOAP and what is ours:
  - CreateSequence, CloseSequence (1.1), LastMessage (1.0), TerminateSequence,
    AckRequested, SequenceAcknowledgement and all WS-RM faults are the plugin's
    own operations, untouched.
  - The Note handler is ours.  It calls soap_wsrm_check_and_wait(): the plugin
    rejects duplicates and, with NoDiscard (the default when the source offers
    no behaviour), holds an out-of-order message up to --hold-ms waiting for
    the gap to fill (it is dropped after that, unacknowledged, so the source
    resends it).  Each connection is served by its own thread, which is what
    lets a held message wait while the missing one arrives.
  - Acknowledgements for a Note: with an anonymous AcksTo the plugin has no
    way to put acks on the HTTP response of a one-way message, so the handler
    answers HTTP 200 with an envelope whose header carries the plugin's
    SequenceAcknowledgement (built by soap_wsrm_reply_num) and whose body is
    empty -- for new messages and for duplicates alike.  With an addressable
    AcksTo it answers 202 and then the plugin sends the acks to AcksTo on a
    new connection (soap_wsrm_acknowledgement).
  - Echo uses the plugin's soap_wsrm_reply(): acks piggy-backed on the
    response, or sent to an addressable AcksTo first (stock behaviour).
*/
#include "peer_common.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>

static FILE *deliveries;
static int hold_us = 2000000;

/* In-order hand-off: the plugin accepts NoDiscard messages strictly in order,
   but their threads race to the file; each waits here for its predecessor. */
struct progress
{
  char *sequence;
  ULONG64 delivered;
  struct progress *next;
};
static struct progress *progress_list;
static pthread_mutex_t deliver_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t deliver_cond = PTHREAD_COND_INITIALIZER;

static struct progress *progress_of(const char *sequence)
{
  struct progress *p;
  for (p = progress_list; p; p = p->next)
    if (!strcmp(p->sequence, sequence))
      return p;
  p = (struct progress*)calloc(1, sizeof(*p));
  if (!p || !(p->sequence = strdup(sequence)))
  {
    peer_log("out of memory");
    exit(1);
  }
  p->next = progress_list;
  progress_list = p;
  return p;
}

static int sequence_behavior(struct soap *soap)
{
  int behavior = NoDiscard;
  soap_wsrm_sequence_handle seq = soap_wsrm_seq(soap);
  if (seq)
  {
    behavior = seq->behavior;
    soap_wsrm_seq_release(soap, seq);
  }
  return behavior;
}

/* Appends the message to the deliveries file (after its predecessor when the
   sequence delivers in order). */
static void deliver(struct soap *soap, const char *operation, const char *text)
{
  const char *sequence = soap->header->wsrm__Sequence->Identifier;
  ULONG64 number = soap->header->wsrm__Sequence->MessageNumber;
  int in_order = sequence_behavior(soap) == NoDiscard;
  struct progress *p;
  pthread_mutex_lock(&deliver_lock);
  p = progress_of(sequence);
  if (in_order)
  {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 30;
    while (p->delivered + 1 < number)
    {
      if (pthread_cond_timedwait(&deliver_cond, &deliver_lock, &deadline) == ETIMEDOUT)
      {
        peer_log("message %s#" SOAP_ULONG_FORMAT " accepted but message " SOAP_ULONG_FORMAT
                 " was never delivered: delivering out of order", sequence, number, p->delivered + 1);
        break;
      }
    }
  }
  fprintf(deliveries, "%s\t%s\t" SOAP_ULONG_FORMAT "\t", operation, sequence, number);
  peer_write_escaped(deliveries, text);
  fputc('\n', deliveries);
  fflush(deliveries);
  if (number > p->delivered)
    p->delivered = number;
  pthread_cond_broadcast(&deliver_cond);
  pthread_mutex_unlock(&deliver_lock);
  peer_log("delivered %s %s#" SOAP_ULONG_FORMAT, operation, sequence, number);
}

/* A duplicate the plugin would answer with a bare 202: for NoDiscard every
   accepted number is <= recvnum (acceptance is gap-free), so we can spot it
   first and still acknowledge it on the back-channel. */
static int is_duplicate(struct soap *soap)
{
  int dup = 0;
  soap_wsrm_sequence_handle seq;
  if (!soap->header || !soap->header->wsrm__Sequence)
    return 0;
  seq = soap_wsrm_seq(soap);
  if (seq)
  {
    dup = soap_wsrm_seq_valid(soap, seq)
       && seq->behavior == NoDiscard
       && soap->header->wsrm__Sequence->MessageNumber <= soap_wsrm_recvnum(seq);
    soap_wsrm_seq_release(soap, seq);
  }
  return dup;
}

/* Sends the current header in an envelope with an empty body, HTTP 200: the
   generated soap_serve_* response code, minus the body element. */
static int send_header_only(struct soap *soap)
{
  soap->encodingStyle = NULL; /* literal: no encodingStyle on Body (SOAP 1.2 forbids it) */
  soap_serializeheader(soap);
  soap_begin_count(soap);
  if ((soap->mode & SOAP_IO_LENGTH))
  {
    if (soap_envelope_begin_out(soap)
     || soap_putheader(soap)
     || soap_body_begin_out(soap)
     || soap_body_end_out(soap)
     || soap_envelope_end_out(soap))
      return soap->error;
  }
  if (soap_end_count(soap)
   || soap_response(soap, SOAP_OK)
   || soap_envelope_begin_out(soap)
   || soap_putheader(soap)
   || soap_body_begin_out(soap)
   || soap_body_end_out(soap)
   || soap_envelope_end_out(soap)
   || soap_end_send(soap))
    return soap_closesock(soap);
  return soap_closesock(soap);
}

/* Acks on the back-channel (anonymous AcksTo): the plugin builds them into
   the header (piggy-back mode), we strip what does not belong in a
   standalone acknowledgement and send header + empty body. */
static int ack_on_backchannel(struct soap *soap)
{
  struct SOAP_ENV__Header *h;
  if (soap_wsrm_reply_num(soap, 0))
    return soap->error;
  h = soap->header;
  if (!h || !h->__sizeSequenceAcknowledgement)
    return soap_send_empty_response(soap, 202);
  h->wsrm__Sequence = NULL;
  h->__sizeAckRequested = 0;
  h->wsrm__AckRequested = NULL;
  h->wsa5__ReplyTo = NULL;
  h->wsa5__FaultTo = NULL;
  h->wsa5__From = NULL;
  if (soap_wsa_reply(soap, NULL, SOAP_NAMESPACE_OF_wsrm "/SequenceAcknowledgement"))
    return soap->error;
  return send_header_only(soap);
}

static int respond_to_note(struct soap *soap)
{
  const char *acksto = NULL;
  soap_wsrm_sequence_handle seq = soap_wsrm_seq(soap);
  int err;
  if (seq)
    acksto = seq->acksto;
  if (peer_is_anonymous(acksto))
    err = ack_on_backchannel(soap);
  else
  {
    soap_send_empty_response(soap, 202);
    err = SOAP_OK;
    if (seq && !peer_is_none(acksto) && soap_wsrm_acknowledgement(soap, seq, NULL))
    {
      peer_log_fault(soap, "sending acks to AcksTo");
      soap->error = SOAP_OK; /* the source will ask again */
    }
  }
  if (seq)
    soap_wsrm_seq_release(soap, seq);
  return err;
}

static void log_not_accepted(struct soap *soap, const char *operation)
{
  if (soap->header && soap->header->wsrm__Sequence)
    peer_log("%s %s#" SOAP_ULONG_FORMAT " not delivered (duplicate, or gap not filled in time)",
             operation, soap->header->wsrm__Sequence->Identifier,
             soap->header->wsrm__Sequence->MessageNumber);
}

static void log_received(struct soap *soap, const char *operation)
{
  if (soap->header && soap->header->wsrm__Sequence)
    peer_log("received %s %s#" SOAP_ULONG_FORMAT, operation,
             soap->header->wsrm__Sequence->Identifier, soap->header->wsrm__Sequence->MessageNumber);
  else
    peer_log("received %s without a wsrm:Sequence header", operation);
}

int ns__Note(struct soap *soap, char *text)
{
  log_received(soap, "Note");
  if (is_duplicate(soap))
  {
    log_not_accepted(soap, "Note");
    return respond_to_note(soap);
  }
  if (soap_wsrm_check_and_wait(soap, -hold_us)) /* 0: drop out-of-order at once */
  {
    if (soap->error == SOAP_STOP)
      log_not_accepted(soap, "Note");
    else
      peer_log_fault(soap, "Note rejected");
    return soap->error;
  }
  deliver(soap, "Note", text);
  return respond_to_note(soap);
}

int ns__Echo(struct soap *soap, char *text, struct ns__EchoResponse *response)
{
  log_received(soap, "Echo");
  if (soap_wsrm_check_and_wait(soap, -hold_us))
  {
    if (soap->error == SOAP_STOP)
      log_not_accepted(soap, "Echo");
    else
      peer_log_fault(soap, "Echo rejected");
    return soap->error;
  }
  deliver(soap, "Echo", text);
  response->text = text;
  return soap_wsrm_reply(soap, NULL, PEER_ACTION_ECHO_RESPONSE);
}

static void *serve_connection(void *arg)
{
  struct soap *soap = (struct soap*)arg;
  pthread_detach(pthread_self());
  if (soap_serve(soap) && soap->error != SOAP_STOP && soap->error != SOAP_EOF)
    peer_log_fault(soap, "serving a request");
  soap_destroy(soap);
  soap_end(soap);
  soap_free(soap);
  return NULL;
}

static void usage(const char *prog)
{
  fprintf(stderr,
    "usage: %s --deliveries FILE [--host 127.0.0.1] [--port 0] [--hold-ms 2000]\n"
    "          [--pulse-ms 0] [--timeout-s 30]\n"
    "WS-RM %s destination (gSOAP wsrm plugin); prints READY <port> when listening.\n",
    prog, PEER_WSRM_VERSION);
  exit(2);
}

static long int_arg(const char *prog, const char *name, const char *value, long lo, long hi)
{
  char *end;
  long v;
  if (!value)
    usage(prog);
  v = strtol(value, &end, 10);
  if (*end || v < lo || v > hi)
  {
    fprintf(stderr, "%s: %s must be an integer in [%ld, %ld], got %s\n", prog, name, lo, hi, value);
    exit(2);
  }
  return v;
}

int main(int argc, char **argv)
{
  const char *host = "127.0.0.1", *path = NULL;
  int port = 0, pulse_ms = 0, timeout_s = 30, i;
  struct soap *soap;
  struct sockaddr_storage addr;
  socklen_t addrlen = sizeof(addr);

  peer_set_role("server");
  for (i = 1; i < argc; i++)
  {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--deliveries") && v) { path = v; i++; }
    else if (!strcmp(a, "--host") && v) { host = v; i++; }
    else if (!strcmp(a, "--port")) { port = (int)int_arg(argv[0], a, v, 0, 65535); i++; }
    else if (!strcmp(a, "--hold-ms")) { hold_us = (int)int_arg(argv[0], a, v, 0, 600000) * 1000; i++; }
    else if (!strcmp(a, "--pulse-ms")) { pulse_ms = (int)int_arg(argv[0], a, v, 0, 600000); i++; }
    else if (!strcmp(a, "--timeout-s")) { timeout_s = (int)int_arg(argv[0], a, v, 1, 3600); i++; }
    else usage(argv[0]);
  }
  if (!path)
    usage(argv[0]);
  signal(SIGPIPE, SIG_IGN);
  deliveries = fopen(path, "a");
  if (!deliveries)
  {
    fprintf(stderr, "%s: cannot open %s: %s\n", argv[0], path, strerror(errno));
    return 1;
  }
  soap = peer_new_context(1, timeout_s); /* replies follow each request's SOAP version */
  if (!soap)
    return 1;
  soap->bind_flags = SO_REUSEADDR;
  /* One request per connection.  With keep-alive the 1.0 plugin's LastMessage
     handler, which "closes" the server's own side by sending a LastMessage to
     the anonymous endpoint, reads the client's next request on the same
     connection as the reply to that and drops it. */
  soap_clr_imode(soap, SOAP_IO_KEEPALIVE);
  soap_clr_omode(soap, SOAP_IO_KEEPALIVE);
  if (!soap_valid_socket(soap_bind(soap, host, port, 100)))
  {
    peer_log_fault(soap, "bind");
    return 1;
  }
  if (getsockname(soap->master, (struct sockaddr*)&addr, &addrlen) == 0)
  {
    if (addr.ss_family == AF_INET)
      port = ntohs(((struct sockaddr_in*)&addr)->sin_port);
    else if (addr.ss_family == AF_INET6)
      port = ntohs(((struct sockaddr_in6*)&addr)->sin6_port);
  }
  printf("READY %d\n", port);
  fflush(stdout);
  peer_log("listening on %s:%d, deliveries to %s", host, port, path);
  if (pulse_ms)
    soap->accept_timeout = -pulse_ms * 1000;
  for (;;)
  {
    struct soap *copy;
    pthread_t tid;
    if (!soap_valid_socket(soap_accept(soap)))
    {
      if (soap->errnum)
      {
        peer_log_fault(soap, "accept");
        continue;
      }
      soap_wsrm_pulse(soap, -10000); /* accept timed out: send pending acks */
      continue;
    }
    copy = soap_copy(soap);
    if (!copy)
    {
      peer_log("out of memory");
      soap_force_closesock(soap);
      continue;
    }
    if (pthread_create(&tid, NULL, serve_connection, copy))
    {
      peer_log("cannot start a thread: %s", strerror(errno));
      soap_force_closesock(copy);
      soap_free(copy);
    }
  }
  return 0;
}
