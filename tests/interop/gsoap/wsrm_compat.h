/*
  wsrm_compat.h -- include this instead of wsrmapi.h (and force-include it when
  compiling plugin/wsrmapi.c: gcc -include wsrm_compat.h).

  Why: with the WS-RM 1.0 headers (import/wsrm5.h -> wsrx5.h) soapcpp2 declares
      __wsrm__TerminateSequence(soap*, TerminateSequenceType*, TerminateSequenceResponseType*)
  while plugin/wsrmapi.h, under SOAP_WSRM_2005, declares the third parameter as
  TerminateSequenceType*.  wsrmapi.c itself defines the soapcpp2 signature, so
  only the prototype in wsrmapi.h is wrong.  We include the generated soapH.h
  first (its include guard keeps the right prototype), then read wsrmapi.h with
  its prototype renamed out of the way.  Harmless for the WS-RM 1.1 build.
*/
#ifndef WSRM_COMPAT_H
#define WSRM_COMPAT_H

#include "soapH.h"

#define __wsrm__TerminateSequence wsrm_compat_unused_wsrmapi_h_TerminateSequence
#include "wsrmapi.h"
#undef __wsrm__TerminateSequence

#endif
