/*
  client.c -- a WS-RM source built from gSOAP's wsrm plugin.

  Usage:
    gsoap-wsrm-client --to URL [--acks-to URL] [--offer] [--op Note|Echo]
                      [--soap11] [--behavior NoDiscard|DiscardEntireSequence|DiscardFollowingFirstGap]
                      [--expires-ms 600000] [--resend-rounds 3] [--retry-ms 200]
                      [--max-retries 50] [--timeout-s 10] [--no-close] [--] TEXT...

  Creates one sequence to URL, sends one message per TEXT (each with
  AckRequested), closes it (1.1 CloseSequence; 1.0 a LastMessage), resends
  what is still unacknowledged with soap_wsrm_resend, terminates, and prints
  on stdout:

      SEQUENCE <id>
      RESPONSE <n> <escaped text>          (--op Echo, one per answered message)
      SUMMARY version=<1.0|1.1> sent=<N> acked=<K> unacked=<n,n,...|-> close=<ok|error:..> terminate=<ok|error:..>

  Exit status: 0 all N messages acknowledged and the sequence closed and
  terminated cleanly; 2 some message unacknowledged; 3 all acknowledged but
  close/terminate failed; 1 anything else (bad usage, CreateSequence or a send
  failed for good: see stderr).

  With --acks-to the client listens on that URL's host:port (a thread serving
  the plugin's SequenceAcknowledgement operation) for the destination's acks.
  --offer offers a sequence for the responses (anonymous endpoint).
*/
#include "peer_common.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The callback (AcksTo) listener.  It processes acks under the plugin's own
   lock, but we walk seq->messages to list unacknowledged numbers, so the
   listener serves one request at a time under cb_lock and we take it too. */
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int cb_stop;

static void *callback_loop(void *arg)
{
  struct soap *cb = (struct soap*)arg;
  cb->accept_timeout = -100000; /* 100 ms: check cb_stop */
  while (!cb_stop)
  {
    if (!soap_valid_socket(soap_accept(cb)))
    {
      if (cb->errnum)
        peer_log_fault(cb, "AcksTo listener accept");
      continue;
    }
    pthread_mutex_lock(&cb_lock);
    if (soap_serve(cb) && cb->error != SOAP_STOP && cb->error != SOAP_EOF)
      peer_log_fault(cb, "AcksTo listener");
    else
      peer_log("AcksTo listener: received %s (%d acknowledgement header(s))",
               cb->action ? cb->action : "a message",
               cb->header ? cb->header->__sizeSequenceAcknowledgement : 0);
    pthread_mutex_unlock(&cb_lock);
    soap_destroy(cb);
    soap_end(cb);
  }
  return NULL;
}

/* The client serves no application operations (the generated dispatcher
   still needs them defined). */
int ns__Note(struct soap *soap, char *text)
{
  (void)text;
  return soap_sender_fault(soap, "this gSOAP client serves only WS-RM acknowledgements", NULL);
}

int ns__Echo(struct soap *soap, char *text, struct ns__EchoResponse *response)
{
  (void)text; (void)response;
  return soap_sender_fault(soap, "this gSOAP client serves only WS-RM acknowledgements", NULL);
}

/* Numbers <= last still cached (unacknowledged), written to out as "n,n,..". */
static ULONG64 unacked(soap_wsrm_sequence_handle seq, ULONG64 last, char *out, size_t outlen)
{
  ULONG64 count = 0;
  size_t used = 0;
  struct soap_wsrm_message *p;
  out[0] = '\0';
  pthread_mutex_lock(&cb_lock);
  for (p = seq->messages; p; p = p->next)
  {
    if (p->num <= last && p->state != SOAP_WSRM_ACK)
    {
      count++;
      if (used + 24 < outlen)
        used += (size_t)snprintf(out + used, outlen - used, "%s" SOAP_ULONG_FORMAT, used ? "," : "", p->num);
    }
  }
  pthread_mutex_unlock(&cb_lock);
  if (!count)
    snprintf(out, outlen, "-");
  return count;
}

static int is_fault(int error)
{
  return error == SOAP_FAULT || error == SOAP_CLI_FAULT || error == SOAP_SVR_FAULT;
}

static void usage(const char *prog)
{
  fprintf(stderr,
    "usage: %s --to URL [--acks-to URL] [--offer] [--op Note|Echo] [--soap11]\n"
    "          [--behavior NoDiscard|DiscardEntireSequence|DiscardFollowingFirstGap]\n"
    "          [--expires-ms 600000] [--resend-rounds 3] [--retry-ms 200] [--max-retries 50]\n"
    "          [--timeout-s 10] [--no-close] [--] TEXT...\n"
    "WS-RM %s source (gSOAP wsrm plugin): one sequence, one message per TEXT.\n",
    prog, PEER_WSRM_VERSION);
  exit(1);
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
    exit(1);
  }
  return v;
}

/* Sends message number i (already prepared with soap_wsrm_request_acks),
   retrying transport failures as the plugin documents. */
static int send_one(struct soap *soap, soap_wsrm_sequence_handle seq, int echo, const char *text,
                    int max_retries, int retry_ms, ULONG64 i)
{
  int tries = 0;
  struct SOAP_ENV__Header *request_header = soap->header;
  for (;;)
  {
    soap->header = request_header; /* the retried send needs the request's header */
    const char *to = soap_wsrm_to(seq);
    if (echo)
    {
      struct ns__EchoResponse response;
      if (!soap_call_ns__Echo(soap, to, PEER_ACTION_ECHO, (char*)text, &response))
      {
        printf("RESPONSE " SOAP_ULONG_FORMAT " ", i);
        peer_write_escaped(stdout, response.text);
        putchar('\n');
        fflush(stdout);
        return SOAP_OK;
      }
    }
    else if (!soap_send_ns__Note(soap, to, PEER_ACTION_NOTE, (char*)text))
    {
      /* soap_recv_empty_response() would skip the header: read the reply as
         the plugin's one-way SequenceAcknowledgement (header, empty body) so
         the acks it carries are processed. */
      struct __wsrm__SequenceAcknowledgement reply;
      if (!soap_recv___wsrm__SequenceAcknowledgement(soap, &reply))
        return SOAP_OK;
    }
    if (soap->error == 202 || soap->error == SOAP_NO_TAG)
      return soap->error = SOAP_OK; /* accepted; acks (if any) were in the header */
    if (is_fault(soap->error))
    {
      peer_log_fault(soap, "message refused by the destination");
      return soap->error;
    }
    if (++tries > max_retries)
    {
      peer_log_fault(soap, "giving up sending");
      return soap->error;
    }
    peer_log_fault(soap, "send failed, retrying");
    soap->header = request_header; /* reading the reply replaced it */
    if (soap_wsrm_check_retry(soap, seq))
    {
      peer_log_fault(soap, "the plugin refuses a retry");
      return soap->error;
    }
    usleep((useconds_t)retry_ms * 1000);
  }
}

int main(int argc, char **argv)
{
  const char *to = NULL, *acks_to = NULL, *op = "Note", *close_status = "ok", *terminate_status = "ok";
  int offer = 0, soap_version = 2, resend_rounds = 3, retry_ms = 200, max_retries = 50;
  int timeout_s = 10, do_close = 1, echo, i, first_text = argc, failed = 0;
  LONG64 expires_ms = 600000;
  enum wsrm__IncompleteSequenceBehaviorType behavior = NoDiscard;
  enum wsrm__FaultCodes prior_fault;
  struct soap *soap, *cb = NULL;
  pthread_t cb_thread;
  soap_wsrm_sequence_handle seq = NULL;
  ULONG64 n, sent = 0, left;
  char list[4096];
  static char errbuf[2][128];

  peer_set_role("client");
  for (i = 1; i < argc; i++)
  {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--")) { first_text = i + 1; break; }
    else if (!strcmp(a, "--to") && v) { to = v; i++; }
    else if (!strcmp(a, "--acks-to") && v) { acks_to = v; i++; }
    else if (!strcmp(a, "--op") && v) { op = v; i++; }
    else if (!strcmp(a, "--offer")) offer = 1;
    else if (!strcmp(a, "--soap11")) soap_version = 1;
    else if (!strcmp(a, "--no-close")) do_close = 0;
    else if (!strcmp(a, "--behavior") && v)
    {
      if (!strcmp(v, "NoDiscard")) behavior = NoDiscard;
      else if (!strcmp(v, "DiscardEntireSequence")) behavior = DiscardEntireSequence;
      else if (!strcmp(v, "DiscardFollowingFirstGap")) behavior = DiscardFollowingFirstGap;
      else usage(argv[0]);
      i++;
    }
    else if (!strcmp(a, "--expires-ms")) { expires_ms = int_arg(argv[0], a, v, 0, 3600000); i++; }
    else if (!strcmp(a, "--resend-rounds")) { resend_rounds = (int)int_arg(argv[0], a, v, 0, 100); i++; }
    else if (!strcmp(a, "--retry-ms")) { retry_ms = (int)int_arg(argv[0], a, v, 0, 60000); i++; }
    else if (!strcmp(a, "--max-retries")) { max_retries = (int)int_arg(argv[0], a, v, 0, 10000); i++; }
    else if (!strcmp(a, "--timeout-s")) { timeout_s = (int)int_arg(argv[0], a, v, 1, 3600); i++; }
    else if (a[0] == '-' && a[1] == '-') usage(argv[0]);
    else { first_text = i; break; }
  }
  if (!to || (strcmp(op, "Note") && strcmp(op, "Echo")))
    usage(argv[0]);
  echo = !strcmp(op, "Echo");
  n = (ULONG64)(argc - first_text);
  signal(SIGPIPE, SIG_IGN);

  soap = peer_new_context(soap_version, timeout_s);
  if (!soap)
    return 1;

  if (acks_to)
  {
    char host[256];
    int port;
    if (peer_parse_http_url(acks_to, host, sizeof(host), &port))
    {
      fprintf(stderr, "%s: --acks-to must be http://host:port/..., got %s\n", argv[0], acks_to);
      return 1;
    }
    cb = peer_new_context(soap_version, timeout_s);
    if (!cb)
      return 1;
    cb->bind_flags = SO_REUSEADDR;
    if (!soap_valid_socket(soap_bind(cb, host, port, 100)))
    {
      peer_log_fault(cb, "binding the AcksTo listener");
      return 1;
    }
    if (pthread_create(&cb_thread, NULL, callback_loop, cb))
    {
      peer_log("cannot start the AcksTo listener thread");
      return 1;
    }
  }

  /* id "" = no Offer; NULL = offer a generated identifier */
  if (soap_wsrm_create_offer_acksto(soap, to, NULL, acks_to, offer ? NULL : "", expires_ms,
                                    behavior, NULL, &seq))
  {
    peer_log_fault(soap, "CreateSequence");
    printf("SUMMARY version=%s sent=0 acked=0 unacked=- close=- terminate=- create=error:%d\n",
           PEER_WSRM_VERSION, soap->error);
    fflush(stdout);
    if (seq)
      soap_wsrm_seq_free(soap, seq);
    return 1;
  }
  printf("SEQUENCE %s\n", seq->id ? seq->id : "-");
  fflush(stdout);
  peer_log("created sequence %s to %s (AcksTo %s)", seq->id ? seq->id : "-", to, acks_to ? acks_to : "anonymous");

  for (i = first_text; i < argc; i++)
  {
    if (soap_wsrm_request_acks(soap, seq, soap_wsa_rand_uuid(soap), echo ? PEER_ACTION_ECHO : PEER_ACTION_NOTE))
    {
      peer_log_fault(soap, "preparing a sequence message");
      failed = 1;
      break;
    }
    sent++;
    if (send_one(soap, seq, echo, argv[i], max_retries, retry_ms, sent))
    {
      failed = 1;
      break;
    }
  }

  if (!failed && do_close)
  {
    if (soap_wsrm_close(soap, seq, NULL))
    {
      snprintf(errbuf[0], sizeof(errbuf[0]), "error:%d", soap->error);
      close_status = errbuf[0];
      peer_log_fault(soap, "close");
    }
  }

  /* resend what is still unacknowledged; 1.1 asks for fresh acks with
     another CloseSequence, 1.0 has no such request on an anonymous AcksTo
     (its LastMessage is a numbered message: re-closing would add one). */
  for (i = 0; !failed && i < resend_rounds && unacked(seq, sent, list, sizeof(list)); i++)
  {
    peer_log("round %d: resending unacknowledged %s", i + 1, list);
    if (soap_wsrm_resend(soap, seq, 1, sent))
      peer_log_fault(soap, "resend");
    if (acks_to)
      usleep(300000); /* let the acks reach the listener */
#ifndef SOAP_WSRM_2005
    else if (do_close && soap_wsrm_close(soap, seq, NULL))
      peer_log_fault(soap, "close (asking for acks)");
#else
    else
      break;
#endif
  }

  prior_fault = seq->fault;
  (void)prior_fault; /* only the 1.0 build needs it */
  if (soap_wsrm_terminate(soap, seq, NULL))
  {
#ifdef SOAP_WSRM_2005
    /* WS-RM 1.0 has no TerminateSequence reply; gSOAP's 1.0 destination
       sends one anyway, echoing the *offered* identifier (empty without an
       Offer), and gSOAP's source then fails its own identifier check with
       UnknownSequence although the destination terminated the sequence.
       seq->fault tells that local check from a fault the destination sent. */
    if (prior_fault == (enum wsrm__FaultCodes)(-1) && seq->fault == wsrm__UnknownSequence)
      peer_log("terminate: the destination answered with a TerminateSequence whose Identifier is not "
               "ours (gSOAP 1.0 quirk); the sequence is terminated");
    else
#endif
    {
      snprintf(errbuf[1], sizeof(errbuf[1]), "error:%d", soap->error);
      terminate_status = errbuf[1];
      peer_log_fault(soap, "terminate");
    }
  }
  if (acks_to)
  {
    /* acks for the last messages may still be on their way */
    int wait;
    for (wait = 0; wait < 20 && unacked(seq, sent, list, sizeof(list)); wait++)
      usleep(100000);
    cb_stop = 1;
    pthread_join(cb_thread, NULL);
  }
  left = unacked(seq, sent, list, sizeof(list));
  if (n != sent)
    failed = 1;
  printf("SUMMARY version=%s sent=" SOAP_ULONG_FORMAT " acked=" SOAP_ULONG_FORMAT " unacked=%s close=%s terminate=%s\n",
         PEER_WSRM_VERSION, sent, sent - left, list, do_close ? close_status : "skipped", terminate_status);
  fflush(stdout);

  soap_wsrm_seq_free(soap, seq);
  soap_destroy(soap);
  soap_end(soap);
  soap_free(soap);
  if (cb)
  {
    soap_destroy(cb);
    soap_end(cb);
    soap_free(cb);
  }
  if (failed)
    return 1;
  if (left)
    return 2;
  if (strcmp(close_status, "ok") || strcmp(terminate_status, "ok"))
    return 3;
  return 0;
}
