/*
  echo.h -- the interop service the gSOAP peer serves and calls.

  Two operations in document/literal style, elements qualified in
  http://example.org/wsrm-interop (the shape a spyne service with that target
  namespace produces, so the project's spyne/zeep side can talk to it):

    Note(text)            one-way: <ns:Note><ns:text>...</ns:text></ns:Note>
    Echo(text) -> text    in-out:  <ns:EchoResponse><ns:text>...</ns:text></ns:EchoResponse>

  Dispatch is on wsa:Action (soapcpp2 -a), so the actions below are the ones a
  client must send.  This file is imported by echo_wsrm11.h / echo_wsrm10.h,
  which pull in the WS-RM 1.1 or 1.0 headers first.
*/

//gsoap ns service name:        Echo
//gsoap ns service namespace:   http://example.org/wsrm-interop
//gsoap ns service location:    http://127.0.0.1:8080/
//gsoap ns service style:       document
//gsoap ns service encoding:    literal
//gsoap ns schema namespace:    http://example.org/wsrm-interop
//gsoap ns schema elementForm:  qualified

//gsoap ns service method-header-part: Note wsa5__MessageID
//gsoap ns service method-header-part: Note wsa5__RelatesTo
//gsoap ns service method-header-part: Note wsa5__From
//gsoap ns service method-header-part: Note wsa5__ReplyTo
//gsoap ns service method-header-part: Note wsa5__FaultTo
//gsoap ns service method-header-part: Note wsa5__To
//gsoap ns service method-header-part: Note wsa5__Action
//gsoap ns service method-header-part: Note wsrm__Sequence
//gsoap ns service method-header-part: Note wsrm__AckRequested
//gsoap ns service method-header-part: Note wsrm__SequenceAcknowledgement
//gsoap ns service method-action:      Note http://example.org/wsrm-interop/Note
int ns__Note(char *text, void);

//gsoap ns service method-header-part: Echo wsa5__MessageID
//gsoap ns service method-header-part: Echo wsa5__RelatesTo
//gsoap ns service method-header-part: Echo wsa5__From
//gsoap ns service method-header-part: Echo wsa5__ReplyTo
//gsoap ns service method-header-part: Echo wsa5__FaultTo
//gsoap ns service method-header-part: Echo wsa5__To
//gsoap ns service method-header-part: Echo wsa5__Action
//gsoap ns service method-header-part: Echo wsrm__Sequence
//gsoap ns service method-header-part: Echo wsrm__AckRequested
//gsoap ns service method-header-part: Echo wsrm__SequenceAcknowledgement
//gsoap ns service method-action:        Echo http://example.org/wsrm-interop/Echo
//gsoap ns service method-output-action: Echo http://example.org/wsrm-interop/EchoResponse
int ns__Echo(char *text, struct ns__EchoResponse { char *text; } *response);
