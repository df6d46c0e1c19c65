/* The one-phase path's usual case in C: an optional accelerator of txmanager.postgres.
 *
 * Why C: what a one-phase transaction adds above plain psycopg2 BEGIN/COMMIT is a few hundred
 * bytecodes of bookkeeping (the block's begin, the pooled session's start, the lazy BEGIN, the
 * one-phase COMMIT, the return to the pool), and at about 26 machine instructions a bytecode no
 * Python form of it fits the 10 us.  The same steps in C cost a tenth.
 *
 * What is here is only the usual case, exactly as the Python code singles it out (the comments
 * name the Python it mirrors; keep both in step).  Before anything is changed, every condition
 * of that case is checked; where one fails, the Python method runs instead, with nothing done
 * here.  After the COMMIT was sent, a failure goes to the same Python helpers the Python path
 * calls in its ``except``s (with the error set as the one being handled, as there).
 * txmanager/postgres/accelerated.py loads this module, hands it the classes and constants it
 * needs (setup()), and falls back to the Python path when it cannot.
 *
 * Fields are read and written at their slot's offset (all are __slots__ of their classes),
 * taken from the slot's member descriptor at setup: an attribute access by name cost three times
 * the rest of this code.  Each object's type is checked first to be exactly the class whose
 * offsets these are; another class (a subclass) goes the Python way, or by name.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>

/* -- what setup() is given ------------------------------------------------------------------ */

static PyTypeObject *T_OnePhase, *T_Transaction, *T_Conn, *T_Branch, *T_SessionReturn, *T_Settings,
                    *T_Resource, *T_DS, *T_TM;
static PyObject *C_PENDING, *C_SQL, *C_B_ACTIVE, *C_B_IDLE, *C_ACTIVE, *C_COMMITTING, *C_COMMITTED,
                *C_ERROR, *C_INERROR;
static PyObject *F_monotonic, *F_py_enter, *F_py_tx_enter, *F_py_conn_enter, *F_py_conn_exit,
                *F_py_tx_call, *F_py_tm_transaction, *F_py_connection, *F_exit, *F_py_cursor, *F_py_execute, *F_pg_cursor,
                *F_pg_execute, *F_begin_refused, *F_commit_failed, *F_fused_failed,
                *F_commit_refused, *F_py_transaction, *F_pg_status, *O_cursor_class, *O_lazy_cursor, *O_zero;

/* slot offsets */
static Py_ssize_t tx_xid, tx_cfg, tx_timeout, tx_deadline, tx_phase, tx_rollback_only, tx_finished,
                  tx_sole, tx_sole_xid, tx_syncs;
static Py_ssize_t cn_mode, cn_xid, cn_tpc_only, cn_own_cursor, cn_lagging, cn_riding;
static Py_ssize_t br_xid, br_state, sr_ds, sr_owner, st_checkpoint;

/* attribute names (interned) */
static PyObject *s_local, *s_dict, *s_tx, *s_closed, *s_idle, *s_settings, *s_default_timeout,
                *s_session, *s_spare, *s_branch, *s_namer, *s_pool_return, *s_shared_as, *s_identity,
                *s_share_sessions, *s_connection, *s_cursor_factory, *s_get_ts,
                *s_statusmessage, *s_pool_size, *s_tm, *s_finished, *s_conn_closed, *s_remove, *s_close, *s_leave, *s_commit, *s_BEGIN,
                *b_COMMIT;

static int ready = 0;
static long inerror;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static inline void
set_slot(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)o + off);
    PyObject *old = *p;
    Py_INCREF(v);
    *p = v;
    Py_XDECREF(old);  /* after the store: a __del__ it runs sees the new value */
}

/* The manager's, the data source's and the resource's fields read here: slots of exactly those
 * classes (their offsets set by setup); any other class, or a slot not set, goes by name (which
 * says what is wrong). */
static struct { PyTypeObject **t; PyObject **name; const char *text; Py_ssize_t off; } hot[] = {
    {&T_Resource, &s_session, "_session", 0}, {&T_Resource, &s_spare, "_spare", 0},
    {&T_Resource, &s_branch, "_branch", 0}, {&T_Resource, &s_namer, "_namer", 0},
    {&T_Resource, &s_pool_return, "_pool_return", 0}, {&T_Resource, &s_shared_as, "_shared_as", 0},
    {&T_DS, &s_idle, "_idle", 0}, {&T_DS, &s_closed, "_closed", 0}, {&T_DS, &s_identity, "identity", 0},
    {&T_DS, &s_share_sessions, "share_sessions", 0}, {&T_DS, &s_pool_size, "pool_size", 0}, {&T_DS, &s_tm, "tm", 0},
    {&T_TM, &s_local, "_local", 0}, {&T_TM, &s_closed, "_closed", 0}, {&T_TM, &s_settings, "_settings", 0},
    {&T_TM, &s_default_timeout, "default_timeout", 0},
};
#define NHOT ((int)(sizeof hot / sizeof hot[0]))

static inline Py_ssize_t
hot_offset(PyTypeObject *t, PyObject *name)
{
    for (int i = 0; i < NHOT; i++)
        if (*hot[i].t == t && *hot[i].name == name) return hot[i].off;
    return 0;
}

static inline PyObject *
aget(PyObject *o, PyObject *name)
{
    Py_ssize_t off = hot_offset(Py_TYPE(o), name);
    if (off) {
        PyObject *v = SLOT(o, off);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(o, name);
}

static inline int
aset(PyObject *o, PyObject *name, PyObject *v)
{
    Py_ssize_t off = hot_offset(Py_TYPE(o), name);
    if (off) { set_slot(o, off, v); return 0; }
    return PyObject_SetAttr(o, name, v);
}

/* ``time.monotonic()`` as a C double: the same clock and conversion as that function's (so
 * the deadlines compare as the Python path's do), without a call, when the transaction module's
 * clock is that function; else the clock it has, called. */
static int mono_builtin = 0;

static int
monotonic_now(double *now)  /* only with mono_builtin */
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    if (PyTime_Monotonic(&t) < 0) return -1;
    *now = PyTime_AsSecondsDouble(t);
#else
    *now = _PyTime_AsSecondsDouble(_PyTime_GetMonotonicClock());
#endif
    return 0;
}

/* ``monotonic() > deadline`` (op Py_GT) or ``<=`` (Py_LE): 1, 0, or -1 with an error */
static int
clock_past(PyObject *deadline, int op)
{
    if (mono_builtin && PyFloat_CheckExact(deadline)) {
        double now;
        if (monotonic_now(&now) < 0) return -1;
        double d = PyFloat_AS_DOUBLE(deadline);
        return op == Py_GT ? now > d : now <= d;
    }
    PyObject *now = PyObject_CallNoArgs(F_monotonic);
    if (now == NULL) return -1;
    int t = PyObject_RichCompareBool(now, deadline, op);
    Py_DECREF(now);
    return t;
}

/* 1 true, 0 false, -1 error; an unset slot (NULL) reads as false here and is never the usual case */
static inline int
truth(PyObject *v)
{
    if (v == Py_True) return 1;
    if (v == Py_False || v == Py_None || v == NULL) return 0;
    return PyObject_IsTrue(v);
}

/* Call f(self, *args) (vectorcall arguments, keywords kept): a Python fallback given a method's
 * arguments as the method descriptor received them. */
static PyObject *
call_with_self(PyObject *f, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[9];
    PyObject **stack = small;
    if (total + 1 > 9) {
        stack = PyMem_Malloc((total + 1) * sizeof(PyObject *));
        if (stack == NULL) return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < total; i++) stack[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(f, stack, nargs + 1, kwnames);
    if (stack != small) PyMem_Free(stack);
    return r;
}

/* Run f(args) as Python code in an ``except`` of the error now raised would: with that error as
 * the one being handled (sys.exc_info(), the __context__ of what it raises, a bare ``raise``).
 * The error is cleared; the result is f's. */
static PyObject *
call_handling(PyObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *t, *v, *tb, *ot, *ov, *otb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL) PyException_SetTraceback(v, tb);
    PyErr_GetExcInfo(&ot, &ov, &otb);
    PyErr_SetExcInfo(t, v, tb);  /* steals */
    PyObject *r = PyObject_Vectorcall(f, args, nargs, NULL);
    PyErr_SetExcInfo(ot, ov, otb);
    return r;
}

/* The error now raised, as an object (a new reference; the error stays raised). */
static PyObject *
current_error(void)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL) PyException_SetTraceback(v, tb);
    Py_XINCREF(v);
    PyErr_Restore(t, v, tb);
    return v;
}

/* -- the block: with ds.transaction() as conn ----------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *tm, *timeout, *tx, *bound, *ds, *local;
} Scope;

static PyMemberDef scope_members[] = {
    {"_tm", T_OBJECT_EX, offsetof(Scope, tm), 0, NULL},
    {"_timeout", T_OBJECT_EX, offsetof(Scope, timeout), 0, NULL},
    {"_tx", T_OBJECT_EX, offsetof(Scope, tx), 0, NULL},
    {"_bound", T_OBJECT_EX, offsetof(Scope, bound), 0, NULL},
    {"_ds", T_OBJECT_EX, offsetof(Scope, ds), 0, NULL},
    {"_local", T_OBJECT_EX, offsetof(Scope, local), 0, NULL},
    {NULL}
};

static int
scope_traverse(Scope *s, visitproc visit, void *arg)
{
    Py_VISIT(s->tm); Py_VISIT(s->timeout); Py_VISIT(s->tx); Py_VISIT(s->bound); Py_VISIT(s->ds);
    Py_VISIT(s->local);
    return 0;
}

static int
scope_clear(Scope *s)
{
    Py_CLEAR(s->tm); Py_CLEAR(s->timeout); Py_CLEAR(s->tx); Py_CLEAR(s->bound); Py_CLEAR(s->ds);
    Py_CLEAR(s->local);
    return 0;
}

static void
scope_dealloc(Scope *s)
{
    PyObject_GC_UnTrack(s);
    scope_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* The three blocks' classes: one layout (Scope), their own members and methods */
#define SCOPE_TYPE(name, doc, members, methods, call) {                                          \
    PyVarObject_HEAD_INIT(NULL, 0)                                                               \
    .tp_name = name, .tp_doc = PyDoc_STR(doc), .tp_basicsize = sizeof(Scope),                     \
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, .tp_new = PyType_GenericNew,             \
    .tp_dealloc = (destructor)scope_dealloc, .tp_traverse = (traverseproc)scope_traverse,         \
    .tp_clear = (inquiry)scope_clear, .tp_members = members, .tp_methods = methods, .tp_call = call}

/* _begin_one_phase(settings, timeout) (txmanager/transaction.py) */
static PyObject *
begin_one_phase(PyObject *settings, PyObject *timeout)
{
    PyObject *tx = T_OnePhase->tp_alloc(T_OnePhase, 0);
    if (tx == NULL) return NULL;
    set_slot(tx, tx_xid, Py_None);
    set_slot(tx, tx_cfg, settings);
    int positive = 0;
    if (PyFloat_CheckExact(timeout)) {
        positive = PyFloat_AS_DOUBLE(timeout) > 0;  /* ``timeout and timeout > 0`` (NaN: no) */
    } else if (timeout != Py_None) {
        positive = PyObject_IsTrue(timeout);
        if (positive > 0) positive = PyObject_RichCompareBool(timeout, O_zero, Py_GT);
        if (positive < 0) { Py_DECREF(tx); return NULL; }
    }
    if (positive) {
        PyObject *deadline;
        if (mono_builtin && PyFloat_CheckExact(timeout)) {
            double now;
            if (monotonic_now(&now) < 0) { Py_DECREF(tx); return NULL; }
            deadline = PyFloat_FromDouble(now + PyFloat_AS_DOUBLE(timeout));
        } else {
            PyObject *now = PyObject_CallNoArgs(F_monotonic);
            if (now == NULL) { Py_DECREF(tx); return NULL; }
            deadline = PyNumber_Add(now, timeout);
            Py_DECREF(now);
        }
        if (deadline == NULL) { Py_DECREF(tx); return NULL; }
        set_slot(tx, tx_timeout, timeout);
        SLOT(tx, tx_deadline) = deadline;  /* a fresh object: nothing there to release */
    } else {
        set_slot(tx, tx_timeout, Py_None);
        set_slot(tx, tx_deadline, Py_None);
    }
    set_slot(tx, tx_phase, C_ACTIVE);
    set_slot(tx, tx_rollback_only, Py_False);
    set_slot(tx, tx_finished, Py_False);
    set_slot(tx, tx_sole, Py_None);
    set_slot(tx, tx_sole_xid, Py_None);
    return tx;
}

/* The session on top of ``idle`` (borrowed) when it is the usual one: idle since its last
 * branch's one-phase COMMIT, so that the next branch starts on it with that branch's object
 * (_ConnectionScope.__enter__'s test); else NULL (an error is set only when one was raised).
 * Nothing is taken: the caller pops it (no other thread runs in between: nothing here lets go
 * of the interpreter). */
static PyObject *
usual_top(PyObject *idle)
{
    if (!PyList_CheckExact(idle) || PyList_GET_SIZE(idle) == 0) return NULL;
    PyObject *resource = PyList_GET_ITEM(idle, PyList_GET_SIZE(idle) - 1);
    if (Py_TYPE(resource) != T_Resource) return NULL;
    PyObject *conn = NULL, *b = NULL, *branch = NULL, *sync = NULL, *closed = NULL, *found = NULL;
    conn = aget(resource, s_session);
    if (conn == NULL || Py_TYPE(conn) != T_Conn) goto out;
    b = aget(resource, s_spare);
    if (b == NULL || Py_TYPE(b) != T_Branch) goto out;
    int t = truth(SLOT(conn, cn_lagging));
    if (t <= 0) goto out;
    t = truth(SLOT(conn, cn_tpc_only));
    if (t != 0) goto out;
    branch = aget(resource, s_branch);
    if (branch != Py_None) goto out;
    sync = aget(resource, s_pool_return);
    if (sync == NULL || Py_TYPE(sync) != T_SessionReturn) goto out;
    closed = PyObject_GetAttr(conn, s_conn_closed);
    if (closed == NULL) goto out;
    t = truth(closed);
    if (t == 0) found = resource;
out:
    Py_XDECREF(conn); Py_XDECREF(b); Py_XDECREF(branch); Py_XDECREF(sync); Py_XDECREF(closed);
    return found;
}

/* Start the next branch of the usual session ``resource`` (just popped) in lean transaction
 * ``tx``, and hand it to this thread: what _ConnectionScope.__enter__ and
 * _TransactionConnectionScope.__enter__ do inline then, in their order.  Returns its
 * connection (a new reference). */
static PyObject *
start_usual(PyObject *tx, PyObject *resource, PyObject *ds)
{
    PyObject *conn = NULL, *b = NULL, *sync = NULL, *ident = NULL, *shared = NULL, *result = NULL;
    if ((conn = aget(resource, s_session)) == NULL || (b = aget(resource, s_spare)) == NULL
            || (sync = aget(resource, s_pool_return)) == NULL)
        goto out;
    ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ident == NULL) goto out;
    PyObject *share = aget(ds, s_share_sessions);
    if (share == NULL) goto out;
    int t = truth(share);
    Py_DECREF(share);
    if (t < 0) goto out;
    shared = t ? aget(ds, s_identity) : Py_NewRef(Py_None);
    if (shared == NULL) goto out;
    if (aset(resource, s_spare, Py_None) < 0) goto out;
    set_slot(b, br_state, C_B_ACTIVE);
    set_slot(conn, cn_lagging, Py_False);
    set_slot(conn, cn_mode, C_PENDING);
    if (aset(resource, s_namer, tx) < 0 || aset(resource, s_branch, b) < 0) goto out;  /* named by tx._name_sole */
    set_slot(tx, tx_sole, resource);
    set_slot(tx, tx_syncs, sync);  /* the one, as itself (see _OnePhase._become_full) */
    set_slot(sync, sr_owner, ident);
    if (aset(resource, s_shared_as, shared) < 0) goto out;
    result = Py_NewRef(conn);
out:
    Py_XDECREF(conn); Py_XDECREF(b); Py_XDECREF(sync); Py_XDECREF(ident); Py_XDECREF(shared);
    return result;
}

/* The thread's binding (``tm._local.__dict__``, a new reference), or NULL with an error. */
static PyObject *
binding(PyObject *tm)
{
    PyObject *local = aget(tm, s_local);
    if (local == NULL) return NULL;
    PyObject *bound = PyObject_GetAttr(local, s_dict);
    Py_DECREF(local);
    return bound;
}

/* 1 when the manager may begin the block's usual transaction here: ``self._timeout is None and
 * not tm._closed and (current is None or current._finished)`` (_TransactionScope.__enter__). */
static int
may_begin(PyObject *tm, PyObject *timeout, PyObject *bound)
{
    if (timeout != Py_None || !PyDict_CheckExact(bound)) return 0;
    PyObject *closed = aget(tm, s_closed);
    if (closed == NULL) return -1;
    int t = truth(closed);
    Py_DECREF(closed);
    if (t != 0) return t < 0 ? -1 : 0;
    PyObject *current = PyDict_GetItemWithError(bound, s_tx);  /* borrowed */
    if (current == NULL) return PyErr_Occurred() ? -1 : 1;
    if (current == Py_None) return 1;
    PyObject *finished = PyObject_GetAttr(current, s_finished);
    if (finished == NULL) return -1;
    t = truth(finished);
    Py_DECREF(finished);
    return t;
}

/* _begin_one_phase(tm._settings, tm.default_timeout) */
static PyObject *
begin_for(PyObject *tm)
{
    PyObject *settings = aget(tm, s_settings);
    if (settings == NULL) return NULL;
    PyObject *timeout = aget(tm, s_default_timeout);
    if (timeout == NULL) { Py_DECREF(settings); return NULL; }
    PyObject *tx = begin_one_phase(settings, timeout);
    Py_DECREF(settings); Py_DECREF(timeout);
    return tx;
}

/* _TransactionConnectionScope.__enter__ (txmanager/postgres/datasource.py): its usual case, else
 * the Python method (nothing done here then but the binding read, which it reads again). */
static PyObject *
scope_enter(Scope *self, PyObject *unused)
{
    PyObject *tm = self->tm, *ds = self->ds, *idle = NULL, *bound = NULL, *tx = NULL, *result = NULL;
    PyObject *resource = NULL;
    if (tm == NULL || ds == NULL || self->timeout == NULL || Py_TYPE(tm) != T_TM) goto python;
    if ((idle = aget(ds, s_idle)) == NULL || (bound = binding(tm)) == NULL) goto out;
    Py_XSETREF(self->bound, Py_NewRef(bound));
    int t = may_begin(tm, self->timeout, bound);
    if (t <= 0) { if (t < 0) goto out; goto python; }
    PyObject *closed = aget(ds, s_closed);
    if (closed == NULL) goto out;
    t = truth(closed);
    Py_DECREF(closed);
    if (t != 0) { if (t < 0) goto out; goto python; }
    resource = usual_top(idle);
    if (resource == NULL) { if (PyErr_Occurred()) goto out; goto python; }
    Py_INCREF(resource);
    /* idle.pop() first, before anything allocates: an allocation may run the garbage collector,
     * and a finalizer's Python code may let another thread in to pop the same session */
    Py_ssize_t n = PyList_GET_SIZE(idle);
    if (PyList_SetSlice(idle, n - 1, n, NULL) < 0) goto out;  /* the resource above */
    /* the usual block: begun here, the session started as _ConnectionScope.__enter__ starts it */
    if ((tx = begin_for(tm)) == NULL) {
        /* nothing was started on it: back where it was (the error stays the one raised) */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        if (PyList_Append(idle, resource) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        goto out;
    }
    Py_XSETREF(self->tx, Py_NewRef(tx));
    if (PyDict_SetItem(bound, s_tx, tx) < 0) goto out;
    result = start_usual(tx, resource, ds);
    goto out;
python:
    result = PyObject_CallOneArg(F_py_enter, (PyObject *)self);
out:
    Py_XDECREF(idle); Py_XDECREF(bound); Py_XDECREF(tx); Py_XDECREF(resource);
    return result;
}

/* _TransactionScope.__enter__ (txmanager/manager.py): the usual begin, else the Python method. */
static PyObject *
tx_enter(Scope *self, PyObject *unused)
{
    PyObject *tm = self->tm, *bound = NULL, *tx = NULL;
    if (tm == NULL || self->timeout == NULL || Py_TYPE(tm) != T_TM)
        return PyObject_CallOneArg(F_py_tx_enter, (PyObject *)self);
    if ((bound = binding(tm)) == NULL) return NULL;
    Py_XSETREF(self->bound, Py_NewRef(bound));
    int t = may_begin(tm, self->timeout, bound);
    if (t <= 0) {
        Py_DECREF(bound);
        return t < 0 ? NULL : PyObject_CallOneArg(F_py_tx_enter, (PyObject *)self);
    }
    tx = begin_for(tm);
    if (tx != NULL && PyDict_SetItem(bound, s_tx, tx) < 0) Py_CLEAR(tx);
    Py_DECREF(bound);
    if (tx != NULL) Py_XSETREF(self->tx, Py_NewRef(tx));
    return tx;
}

/* _ConnectionScope.__enter__ (txmanager/postgres/datasource.py): its usual case (a lean
 * transaction's first resource, a usual session idle), else the Python method. */
static PyObject *
conn_enter(Scope *self, PyObject *unused)
{
    PyObject *ds = self->ds, *tm = NULL, *bound = NULL, *idle = NULL, *resource = NULL, *result = NULL;
    if (ds == NULL || Py_TYPE(ds) != T_DS) goto python;
    PyObject *closed = aget(ds, s_closed);
    if (closed == NULL) goto out;
    int t = truth(closed);
    Py_DECREF(closed);
    if (t != 0) { if (t < 0) goto out; goto python; }
    if ((tm = aget(ds, s_tm)) == NULL) goto out;
    if (Py_TYPE(tm) != T_TM) goto python;
    if ((bound = binding(tm)) == NULL) goto out;
    PyObject *tx = PyDict_CheckExact(bound) ? PyDict_GetItemWithError(bound, s_tx) : NULL;  /* borrowed */
    if (tx == NULL) { if (PyErr_Occurred()) goto out; goto python; }
    /* a lean transaction, active, with no resource yet: its first */
    if (Py_TYPE(tx) != T_OnePhase || SLOT(tx, tx_sole) != Py_None || SLOT(tx, tx_phase) != C_ACTIVE
            || SLOT(tx, tx_finished) != Py_False || SLOT(tx, tx_rollback_only) != Py_False)
        goto python;
    PyObject *deadline = SLOT(tx, tx_deadline);
    if (deadline == NULL) goto python;
    if (deadline != Py_None) {
        t = clock_past(deadline, Py_LE);
        if (t <= 0) { if (t < 0) goto out; goto python; }
    }
    if ((idle = aget(ds, s_idle)) == NULL) goto out;
    resource = usual_top(idle);
    if (resource == NULL) { if (PyErr_Occurred()) goto out; goto python; }
    Py_INCREF(resource);
    Py_ssize_t n = PyList_GET_SIZE(idle);
    if (PyList_SetSlice(idle, n - 1, n, NULL) < 0) goto out;  /* idle.pop(): the resource above */
    Py_INCREF(tx);
    result = start_usual(tx, resource, ds);
    Py_DECREF(tx);
    goto out;
python:
    result = PyObject_CallOneArg(F_py_conn_enter, (PyObject *)self);
out:
    Py_XDECREF(tm); Py_XDECREF(bound); Py_XDECREF(idle); Py_XDECREF(resource);
    return result;
}

/* -- the commit: _OnePhase.commit with PostgresXAResource.end_and_commit_one_phase ---------- */

/* tx.commit(), the Python way */
static int
py_commit(PyObject *tx)
{
    PyObject *r = PyObject_CallMethodNoArgs(tx, s_commit);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* ``if self._xid is not None: self._leave_completion()`` (the commit's ``finally``), keeping
 * an error already raised unless this raises one of its own */
static int
leave_completion(PyObject *tx, int ok)
{
    PyObject *xid = SLOT(tx, tx_xid);
    if (xid == NULL || xid == Py_None) return ok;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = PyObject_CallMethodNoArgs(tx, s_leave);
    if (r == NULL) {  /* raised in the finally: it replaces the one before, chained to it */
        if (v != NULL) {
            PyErr_NormalizeException(&t, &v, &tb);
            if (tb != NULL) PyException_SetTraceback(v, tb);
            _PyErr_ChainExceptions(t, v, tb);
        }
        return -1;
    }
    Py_DECREF(r);
    PyErr_Restore(t, v, tb);
    return ok;
}

/* The session back to its pool: _SessionReturn.after_completion's usual case, as
 * end_and_commit_one_phase runs it inline (the session idle after its one-phase COMMIT). */
static int
return_to_pool(PyObject *sync, PyObject *resource)
{
    PyObject *ds = SLOT(sync, sr_ds);
    if (ds == NULL) { PyErr_SetString(PyExc_AttributeError, "_ds"); return -1; }
    PyObject *idle = aget(ds, s_idle);
    if (idle == NULL) return -1;
    PyObject *size = aget(ds, s_pool_size);
    if (size == NULL) { Py_DECREF(idle); return -1; }
    int room;
    Py_ssize_t n = PyList_CheckExact(idle) ? PyList_GET_SIZE(idle) : -1;
    Py_ssize_t limit = (n >= 0 && PyLong_CheckExact(size)) ? PyLong_AsSsize_t(size) : -1;
    if (limit == -1 && PyErr_Occurred()) PyErr_Clear();
    if (n >= 0 && limit >= 0) {
        room = n < limit;
    } else {  /* ``len(idle) < ds.pool_size``, the generic way */
        PyObject *len = PyLong_FromSsize_t(PyObject_Length(idle));
        room = len == NULL ? -1 : PyObject_RichCompareBool(len, size, Py_LT);
        Py_XDECREF(len);
    }
    Py_DECREF(size);
    if (room < 0) { Py_DECREF(idle); return -1; }
    if (room) {
        int r = PyList_CheckExact(idle) ? PyList_Append(idle, resource)
                                          : (Py_XDECREF(PyObject_CallMethod(idle, "append", "O", resource)),
                                             PyErr_Occurred() ? -1 : 0);
        if (r < 0) { Py_DECREF(idle); return -1; }
        PyObject *closed = aget(ds, s_closed);
        int t = closed == NULL ? -1 : truth(closed);
        Py_XDECREF(closed);
        if (t <= 0) { Py_DECREF(idle); return t; }  /* close(), not yet begun, will find it there */
        PyObject *removed = PyObject_CallMethodOneArg(idle, s_remove, resource);
        Py_DECREF(idle);
        if (removed == NULL) {
            if (PyErr_ExceptionMatches(PyExc_ValueError)) { PyErr_Clear(); return 0; }  /* close() took it */
            return -1;
        }
        Py_DECREF(removed);
    } else {
        Py_DECREF(idle);
    }
    PyObject *r = PyObject_CallMethodNoArgs(resource, s_close);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* After the COMMIT was sent and an error is raised: what the Python path's two ``except``s do
 * with it (PostgresXAResource._one_phase_commit_failed for a psycopg2 error, which raises, then
 * _OnePhase._fused_failed for any Exception, which returns after a heuristic commit). */
static int
commit_failed(PyObject *tx, PyObject *sole, PyObject *b, PyObject *conn)
{
    if (PyErr_ExceptionMatches(C_ERROR)) {
        PyObject *e = current_error();
        PyObject *args[4] = {sole, b, conn, e};
        PyObject *r = call_handling(F_commit_failed, args, 4);
        Py_XDECREF(e);
        if (r != NULL) {  /* it always raises */
            Py_DECREF(r);
            PyErr_SetString(PyExc_SystemError, "_one_phase_commit_failed returned");
        }
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyObject *e = current_error();
    PyObject *args[2] = {tx, e};
    PyObject *r = call_handling(F_fused_failed, args, 2);
    Py_XDECREF(e);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;  /* a heuristic commit: done */
}

static int
one_phase_commit(PyObject *tx)
{
    if (Py_TYPE(tx) != T_OnePhase) return py_commit(tx);
    PyObject *sole = SLOT(tx, tx_sole), *deadline = SLOT(tx, tx_deadline), *cfg = SLOT(tx, tx_cfg);
    PyObject *xid = SLOT(tx, tx_sole_xid), *sync = SLOT(tx, tx_syncs), *phase = SLOT(tx, tx_phase);
    if (sole == NULL || sole == Py_None || Py_TYPE(sole) != T_Resource || deadline == NULL || cfg == NULL
            || Py_TYPE(cfg) != T_Settings || SLOT(cfg, st_checkpoint) != Py_None || xid == NULL
            || sync == NULL || Py_TYPE(sync) != T_SessionReturn || phase != C_ACTIVE)
        return py_commit(tx);
    int t = truth(SLOT(tx, tx_rollback_only));
    if (t != 0) return t < 0 ? -1 : py_commit(tx);
    if (deadline != Py_None) {
        t = clock_past(deadline, Py_GT);
        if (t != 0) return t < 0 ? -1 : py_commit(tx);  /* expired: the general path says so */
    }
    /* end_and_commit_one_phase's usual case, all its conditions first */
    int ok = -1, usual = 0;
    PyObject *b = NULL, *conn = NULL, *pool = NULL, *status = NULL, *r = NULL, *msg = NULL;
    b = aget(sole, s_branch);
    if (b == NULL) goto out;
    conn = aget(sole, s_session);
    if (conn == NULL) goto out;
    pool = aget(sole, s_pool_return);
    if (pool == NULL) goto out;
    PyObject *own = NULL, *riding = NULL;
    if (Py_TYPE(b) == T_Branch && SLOT(b, br_xid) == xid && SLOT(b, br_state) == C_B_ACTIVE
            && Py_TYPE(conn) == T_Conn && SLOT(conn, cn_mode) == C_SQL && pool == sync) {
        own = SLOT(conn, cn_own_cursor);
        riding = SLOT(conn, cn_riding);
        usual = own != NULL && Py_TYPE(own) == (PyTypeObject *)O_cursor_class && riding != NULL
                && PyList_CheckExact(riding) && PyList_GET_SIZE(riding) == 0;
    }
    if (usual) {
        /* INERROR (a statement failed) or above it UNKNOWN (no good connection) */
        status = PyObject_Vectorcall(F_pg_status, &conn, 1, NULL);  /* psycopg2's, LazyBeginConnection's too */
        if (status == NULL) goto out;
        long st = PyLong_AsLong(status);
        if (st == -1 && PyErr_Occurred()) goto out;
        usual = st < inerror;
    }
    if (!usual) { ok = py_commit(tx); goto out; }
    /* the COMMIT, with the Python path's steps in order */
    set_slot(tx, tx_phase, C_COMMITTING);
    set_slot(b, br_state, C_B_IDLE);
    {
        PyObject *a[2] = {own, b_COMMIT};
        r = PyObject_Vectorcall(F_pg_execute, a, 2, NULL);
    }
    if (r != NULL) {
        msg = PyObject_GetAttr(own, s_statusmessage);
        if (msg != NULL && !(PyUnicode_Check(msg) && PyUnicode_CompareWithASCIIString(msg, "COMMIT") == 0)) {
            PyObject *refused = PyObject_CallOneArg(F_commit_refused, own);  /* raises */
            Py_XDECREF(refused);
            if (refused != NULL) PyErr_SetString(PyExc_SystemError, "raise_commit_refused returned");
        }
    }
    if (PyErr_Occurred()) {
        ok = commit_failed(tx, sole, b, conn);
        if (ok == 0) {  /* a heuristic commit, finished by _fused_failed */
            ok = leave_completion(tx, 0);
        } else {
            ok = leave_completion(tx, -1);
        }
        goto out;
    }
    set_slot(conn, cn_mode, Py_None);
    set_slot(conn, cn_xid, Py_None);
    set_slot(conn, cn_lagging, Py_True);  /* psycopg2's autocommit flag stays on (see LazyBeginConnection) */
    if (aset(sole, s_branch, Py_None) < 0 || aset(sole, s_namer, Py_None) < 0)
        goto failed_after;
    if (xid == Py_None && aset(sole, s_spare, b) < 0)  /* the next unnamed branch reuses it */
        goto failed_after;
    if (return_to_pool(sync, sole) < 0) goto failed_after;
    /* SYNC_RAN: what _finish(_COMMITTED) does, the synchronization run */
    set_slot(tx, tx_phase, C_COMMITTED);
    set_slot(tx, tx_finished, Py_True);
    ok = leave_completion(tx, 0);
    goto out;
failed_after:
    /* (only memory, or a close() that raised: as from inside the Python path's try) */
    ok = commit_failed(tx, sole, b, conn);
    ok = leave_completion(tx, ok);
out:
    Py_XDECREF(b); Py_XDECREF(conn); Py_XDECREF(pool); Py_XDECREF(status); Py_XDECREF(r); Py_XDECREF(msg);
    return ok;
}

/* _TransactionScope.__exit__ (txmanager/manager.py): a block ended without an error commits */
static PyObject *
scope_exit(Scope *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || args[1] != Py_None || self->tx == NULL || self->tx == Py_None || self->bound == NULL
            || !PyDict_CheckExact(self->bound))
        return call_with_self(F_exit, (PyObject *)self, args, nargs, NULL);
    PyObject *bound = self->bound;
    PyObject *current = PyDict_GetItemWithError(bound, s_tx);  /* borrowed */
    if (current == NULL) {
        if (PyErr_Occurred()) return NULL;
        return call_with_self(F_exit, (PyObject *)self, args, nargs, NULL);  /* its KeyError */
    }
    PyObject *tx = self->tx;  /* the reference moves here */
    self->tx = Py_NewRef(Py_None);
    Py_INCREF(bound);
    PyObject *result = NULL;
    if (current != tx) {  /* the body committed, rolled back or suspended it itself */
        result = Py_NewRef(Py_None);
        goto out;
    }
    PyObject *finished = (Py_TYPE(tx) == T_OnePhase || Py_TYPE(tx) == T_Transaction)
                         ? Py_XNewRef(SLOT(tx, tx_finished)) : PyObject_GetAttr(tx, s_finished);
    if (finished == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_finished");
        goto out;
    }
    int t = truth(finished);
    Py_DECREF(finished);
    if (t != 0) {
        if (t > 0) result = Py_NewRef(Py_None);
        goto out;
    }
    int ok = one_phase_commit(tx);
    /* finally: unbound */
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    int set = PyDict_SetItem(bound, s_tx, Py_None);
    if (set < 0) {
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
        goto out;
    }
    PyErr_Restore(et, ev, etb);
    if (ok == 0) result = Py_NewRef(Py_None);
out:
    Py_DECREF(tx);
    Py_DECREF(bound);
    return result;
}

static PyMethodDef scope_methods[] = {
    {"__enter__", (PyCFunction)scope_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))scope_exit, METH_FASTCALL, NULL},
    {NULL}
};

static PyTypeObject ScopeType = SCOPE_TYPE("txmanager._onephase.TransactionConnectionScope",
    "XADataSource.transaction()'s block (see _TransactionConnectionScope)", scope_members, scope_methods, NULL);

/* _ConnectionScope.__exit__: nothing in a transaction (the session returns to its pool when the
 * transaction completes); a local connection's own block ends in Python */
static PyObject *
conn_exit(Scope *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 3 && self->local == Py_None) Py_RETURN_NONE;
    return call_with_self(F_py_conn_exit, (PyObject *)self, args, nargs, NULL);
}

/* ``@tm.transaction()``: _TransactionScope.__call__ */
static PyObject *
tx_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *head = PyTuple_Pack(1, self);
    if (head == NULL) return NULL;
    PyObject *all = PySequence_Concat(head, args);
    Py_DECREF(head);
    if (all == NULL) return NULL;
    PyObject *r = PyObject_Call(F_py_tx_call, all, kwargs);
    Py_DECREF(all);
    return r;
}

static PyMemberDef tx_members[] = {
    {"_tm", T_OBJECT_EX, offsetof(Scope, tm), 0, NULL},
    {"_timeout", T_OBJECT_EX, offsetof(Scope, timeout), 0, NULL},
    {"_tx", T_OBJECT_EX, offsetof(Scope, tx), 0, NULL},
    {"_bound", T_OBJECT_EX, offsetof(Scope, bound), 0, NULL},
    {NULL}
};

static PyMethodDef tx_methods[] = {
    {"__enter__", (PyCFunction)tx_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))scope_exit, METH_FASTCALL, NULL},
    {NULL}
};

static PyTypeObject TxScopeType = SCOPE_TYPE("txmanager._onephase.TransactionScope",
    "TransactionManager.transaction()'s block (see _TransactionScope)", tx_members, tx_methods, tx_call);

static PyMemberDef conn_members[] = {
    {"_ds", T_OBJECT_EX, offsetof(Scope, ds), 0, NULL},
    {"_local", T_OBJECT_EX, offsetof(Scope, local), 0, NULL},
    {NULL}
};

static PyMethodDef conn_methods[] = {
    {"__enter__", (PyCFunction)conn_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))conn_exit, METH_FASTCALL, NULL},
    {NULL}
};

static PyTypeObject ConnScopeType = SCOPE_TYPE("txmanager._onephase.ConnectionScope",
    "XADataSource.connection()'s block (see _ConnectionScope)", conn_members, conn_methods, NULL);

/* TransactionManager.transaction (txmanager/manager.py): the block, made here */
static PyObject *
tm_transaction(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *timeout = Py_None;
    if (kwnames == NULL && nargs <= 1) {
        if (nargs == 1) timeout = args[0];
    } else if (nargs == 0 && PyTuple_GET_SIZE(kwnames) == 1
               && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") == 0) {
        timeout = args[0];
    } else {
        return call_with_self(F_py_tm_transaction, self, args, nargs, kwnames);
    }
    Scope *scope = (Scope *)TxScopeType.tp_alloc(&TxScopeType, 0);
    if (scope == NULL) return NULL;
    scope->tm = Py_NewRef(self);
    scope->timeout = Py_NewRef(timeout);
    return (PyObject *)scope;
}

/* XADataSource.connection (txmanager/postgres/datasource.py): the block, made here */
static PyObject *
ds_connection(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 0 || kwnames != NULL) return call_with_self(F_py_connection, self, args, nargs, kwnames);
    Scope *scope = (Scope *)ConnScopeType.tp_alloc(&ConnScopeType, 0);
    if (scope == NULL) return NULL;
    scope->ds = Py_NewRef(self);
    scope->local = Py_NewRef(Py_None);
    return (PyObject *)scope;
}

/* XADataSource.transaction (txmanager/postgres/datasource.py): the block, made here for the
 * manager's own class (a Python method's frame was a tenth of the block's cost) */
static PyObject *
ds_transaction(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *timeout = Py_None;
    if (kwnames == NULL && nargs <= 1) {
        if (nargs == 1) timeout = args[0];
    } else if (nargs == 0 && PyTuple_GET_SIZE(kwnames) == 1
               && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") == 0) {
        timeout = args[0];
    } else {
        return call_with_self(F_py_transaction, self, args, nargs, kwnames);
    }
    PyObject *tm = aget(self, s_tm);
    if (tm == NULL) return NULL;
    if (Py_TYPE(tm) != T_TM) {  /* another manager: its own blocks, nested (Python) */
        Py_DECREF(tm);
        return call_with_self(F_py_transaction, self, args, nargs, kwnames);
    }
    Scope *scope = (Scope *)ScopeType.tp_alloc(&ScopeType, 0);
    if (scope == NULL) { Py_DECREF(tm); return NULL; }
    scope->tm = tm;  /* the reference moves */
    scope->timeout = Py_NewRef(timeout);
    scope->ds = Py_NewRef(self);
    scope->local = Py_NewRef(Py_None);
    return (PyObject *)scope;
}

/* -- LazyBeginConnection.cursor and LazyBeginCursor.execute (txmanager/lazy_begin.py) --------- */

static PyObject *
conn_cursor(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs == 0 && kwnames == NULL) {  /* the usual call */
        PyObject *factory = PyObject_GetAttr(self, s_cursor_factory);
        if (factory == NULL) return NULL;
        int usual = factory == O_lazy_cursor;
        Py_DECREF(factory);
        if (usual) return PyObject_CallOneArg(F_pg_cursor, self);
    }
    return call_with_self(F_py_cursor, self, args, nargs, kwnames);
}

static PyObject *
cursor_execute(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL || nargs < 1 || nargs > 2)
        return call_with_self(F_py_execute, self, args, nargs, kwnames);
    PyObject *query = args[0], *vars = nargs == 2 ? args[1] : Py_None;
    PyObject *conn = PyObject_GetAttr(self, s_connection);
    if (conn == NULL) return NULL;
    PyObject *result;
    PyObject *mode = Py_TYPE(conn) == T_Conn ? SLOT(conn, cn_mode) : NULL;
    if (mode == NULL) goto python;
    if (mode != C_PENDING) {
        PyObject *riding = SLOT(conn, cn_riding);
        int t = truth(SLOT(conn, cn_lagging));
        if (t != 0 || riding == NULL || !PyList_CheckExact(riding) || PyList_GET_SIZE(riding) != 0) {
            if (t < 0) goto error;
            goto python;  /* a cursor kept from a branch, or writes riding: the Python method */
        }
        PyObject *a[3] = {self, query, vars};
        result = PyObject_Vectorcall(F_pg_execute, a, 3, NULL);
        goto out;
    }
    if (!PyUnicode_CheckExact(query)) goto python;  /* (its _execute_first) */
    /* the usual first statement: BEGIN rides in front of it */
    set_slot(conn, cn_mode, C_SQL);
    PyObject *prefixed = PyUnicode_Concat(s_BEGIN, query);
    if (prefixed == NULL) goto error;
    {
        PyObject *a[3] = {self, prefixed, vars};
        result = PyObject_Vectorcall(F_pg_execute, a, 3, NULL);
    }
    Py_DECREF(prefixed);
    if (result == NULL && PyErr_ExceptionMatches(C_ERROR)) {
        PyObject *a[4] = {conn, self, query, vars};
        result = call_handling(F_begin_refused, a, 4);
    }
    goto out;
python:
    result = PyObject_CallFunctionObjArgs(F_py_execute, self, query, vars, NULL);
    goto out;
error:
    result = NULL;
out:
    Py_DECREF(conn);
    return result;
}

static PyMethodDef cursor_def = {"cursor", (PyCFunction)(void (*)(void))conn_cursor,
                                 METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef transaction_def = {"transaction", (PyCFunction)(void (*)(void))ds_transaction,
                                      METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef tm_transaction_def = {"transaction", (PyCFunction)(void (*)(void))tm_transaction,
                                         METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef connection_def = {"connection", (PyCFunction)(void (*)(void))ds_connection,
                                     METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef execute_def = {"execute", (PyCFunction)(void (*)(void))cursor_execute,
                                  METH_FASTCALL | METH_KEYWORDS, NULL};

/* -- setup ----------------------------------------------------------------------------------- */

static int
take(PyObject *ns, const char *key, PyObject **into)
{
    PyObject *v = PyDict_GetItemString(ns, key);  /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "setup() needs %s", key);
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(*into, v);
    return 0;
}

static int
take_type(PyObject *ns, const char *key, PyTypeObject **into)
{
    PyObject *v = NULL;
    if (take(ns, key, &v) < 0) return -1;
    if (!PyType_Check(v)) {
        Py_DECREF(v);
        PyErr_Format(PyExc_TypeError, "setup(): %s is not a class", key);
        return -1;
    }
    Py_XSETREF(*into, (PyTypeObject *)v);
    return 0;
}

/* The offset of slot ``name`` of ``type``: its member descriptor's (a Python __slots__ entry). */
static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *into)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) return -1;
    int ok = Py_TYPE(d) == &PyMemberDescr_Type && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
             && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
    if (ok) *into = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) PyErr_Format(PyExc_TypeError, "setup(): %s.%s is not a slot", type->tp_name, name);
    return ok ? 0 : -1;
}

static int
intern(PyObject **into, const char *text)
{
    *into = PyUnicode_InternFromString(text);
    return *into == NULL ? -1 : 0;
}

/* ``__text_signature__`` and the Python method's docstring, for the C method that replaces it
 * (kept for the life of the process: a PyMethodDef's doc is a C string) */
static int
method_doc(PyMethodDef *def, const char *signature, PyObject *python)
{
    PyObject *doc = PyObject_GetAttrString(python, "__doc__");
    if (doc == NULL) return -1;
    const char *text = doc == Py_None ? "" : PyUnicode_AsUTF8(doc);
    if (text == NULL) { Py_DECREF(doc); return -1; }
    size_t n = strlen(signature) + strlen(text) + 8;
    char *buf = PyMem_RawMalloc(n);
    if (buf == NULL) { Py_DECREF(doc); PyErr_NoMemory(); return -1; }
    snprintf(buf, n, "%s\n--\n\n%s", signature, text);
    Py_DECREF(doc);
    def->ml_doc = buf;
    return 0;
}

static PyObject *
setup(PyObject *module, PyObject *ns)
{
    if (!PyDict_Check(ns)) return PyErr_Format(PyExc_TypeError, "setup() takes a dict");
    if (ready) return PyErr_Format(PyExc_RuntimeError, "setup() runs once");
    struct { const char *key; PyTypeObject **into; } classes[] = {
        {"_OnePhase", &T_OnePhase},
        {"Transaction", &T_Transaction},
        {"LazyBeginConnection", &T_Conn},
        {"_Branch", &T_Branch},
        {"_SessionReturn", &T_SessionReturn},
        {"_Settings", &T_Settings},
        {"PostgresXAResource", &T_Resource},
        {"XADataSource", &T_DS},
        {"TransactionManager", &T_TM},
    };
    struct { const char *key; PyObject **into; } objects[] = {
        {"_PENDING", &C_PENDING},
        {"_SQL", &C_SQL},
        {"_B_ACTIVE", &C_B_ACTIVE},
        {"_B_IDLE", &C_B_IDLE},
        {"_ACTIVE", &C_ACTIVE},
        {"_COMMITTING", &C_COMMITTING},
        {"_COMMITTED", &C_COMMITTED},
        {"Error", &C_ERROR},
        {"TRANSACTION_STATUS_INERROR", &C_INERROR},
        {"monotonic", &F_monotonic},
        {"py_enter", &F_py_enter},
        {"py_tx_enter", &F_py_tx_enter},
        {"py_conn_enter", &F_py_conn_enter},
        {"py_conn_exit", &F_py_conn_exit},
        {"py_tx_call", &F_py_tx_call},
        {"py_tm_transaction", &F_py_tm_transaction},
        {"py_connection", &F_py_connection},
        {"exit", &F_exit},
        {"py_cursor", &F_py_cursor},
        {"py_execute", &F_py_execute},
        {"pg_cursor", &F_pg_cursor},
        {"pg_execute", &F_pg_execute},
        {"begin_refused", &F_begin_refused},
        {"commit_failed", &F_commit_failed},
        {"fused_failed", &F_fused_failed},
        {"raise_commit_refused", &F_commit_refused},
        {"cursor", &O_cursor_class},
        {"LazyBeginCursor", &O_lazy_cursor},
        {"py_transaction", &F_py_transaction},
        {"pg_status", &F_pg_status},
    };
    struct { PyTypeObject **type; const char *name; Py_ssize_t *into; } slots[] = {
        {&T_Transaction, "_xid", &tx_xid},
        {&T_Transaction, "_cfg", &tx_cfg},
        {&T_Transaction, "timeout", &tx_timeout},
        {&T_Transaction, "deadline", &tx_deadline},
        {&T_Transaction, "_phase", &tx_phase},
        {&T_Transaction, "_rollback_only", &tx_rollback_only},
        {&T_Transaction, "_finished", &tx_finished},
        {&T_Transaction, "_sole", &tx_sole},
        {&T_Transaction, "_sole_xid", &tx_sole_xid},
        {&T_Transaction, "_syncs", &tx_syncs},
        {&T_Conn, "_mode", &cn_mode},
        {&T_Conn, "_xid", &cn_xid},
        {&T_Conn, "_tpc_only", &cn_tpc_only},
        {&T_Conn, "_own_cursor", &cn_own_cursor},
        {&T_Conn, "_lagging", &cn_lagging},
        {&T_Conn, "_riding", &cn_riding},
        {&T_Branch, "xid", &br_xid},
        {&T_Branch, "state", &br_state},
        {&T_SessionReturn, "_ds", &sr_ds},
        {&T_SessionReturn, "_owner", &sr_owner},
        {&T_Settings, "checkpoint", &st_checkpoint},
    };
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (take_type(ns, classes[i].key, classes[i].into) < 0) return NULL;
    for (size_t i = 0; i < sizeof objects / sizeof objects[0]; i++)
        if (take(ns, objects[i].key, objects[i].into) < 0) return NULL;
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(*slots[i].type, slots[i].name, slots[i].into) < 0) return NULL;
    for (int i = 0; i < NHOT; i++)
        if (slot_offset(*hot[i].t, hot[i].text, &hot[i].off) < 0) return NULL;
    inerror = PyLong_AsLong(C_INERROR);
    if (inerror == -1 && PyErr_Occurred()) return NULL;
    {   /* the clock: time.monotonic itself, read without a call (monotonic_now) */
        PyObject *time = PyImport_ImportModule("time");
        PyObject *mono = time ? PyObject_GetAttrString(time, "monotonic") : NULL;
        Py_XDECREF(time);
        if (mono == NULL) return NULL;
        mono_builtin = mono == F_monotonic;
        Py_DECREF(mono);
    }
    {   /* the session's state is asked of psycopg2's own method (LazyBeginConnection keeps it) */
        PyObject *found = _PyType_Lookup(T_Conn, s_get_ts);  /* borrowed */
        if (found != F_pg_status)
            return PyErr_Format(PyExc_TypeError, "setup(): LazyBeginConnection.get_transaction_status is not psycopg2's");
    }
    /* _OnePhase and Transaction share one layout (__class__ changes between them) */
    if (T_OnePhase->tp_basicsize != T_Transaction->tp_basicsize || T_OnePhase->tp_base != T_Transaction)
        return PyErr_Format(PyExc_TypeError, "setup(): _OnePhase is not Transaction's layout");
    PyObject *cursor_doc = NULL, *execute_doc = NULL;
    if (method_doc(&cursor_def, "cursor($self, /, name=None, cursor_factory=None, scrollable=None, withhold=False)",
                   F_py_cursor) < 0
        || method_doc(&execute_def, "execute($self, /, query, vars=None)", F_py_execute) < 0)
        return NULL;
    if (method_doc(&transaction_def, "transaction($self, /, timeout=None)", F_py_transaction) < 0) return NULL;
    PyObject *transaction = PyDescr_NewMethod(T_DS, &transaction_def);
    if (transaction == NULL) return NULL;
    if (method_doc(&tm_transaction_def, "transaction($self, /, timeout=None)", F_py_tm_transaction) < 0
        || method_doc(&connection_def, "connection($self, /)", F_py_connection) < 0)
        return NULL;
    PyObject *tm_transaction_m = PyDescr_NewMethod(T_TM, &tm_transaction_def);
    if (tm_transaction_m == NULL) return NULL;
    PyObject *connection_m = PyDescr_NewMethod(T_DS, &connection_def);
    if (connection_m == NULL) return NULL;
    cursor_doc = PyDescr_NewMethod(T_Conn, &cursor_def);
    if (cursor_doc == NULL) return NULL;
    execute_doc = PyDescr_NewMethod((PyTypeObject *)O_lazy_cursor, &execute_def);
    if (execute_doc == NULL) { Py_DECREF(cursor_doc); return NULL; }
    ready = 1;
    return Py_BuildValue("{sOsOsOsNsNsNsNsN}", "TransactionConnectionScope", (PyObject *)&ScopeType,
                         "TransactionScope", (PyObject *)&TxScopeType, "ConnectionScope", (PyObject *)&ConnScopeType,
                         "cursor", cursor_doc, "execute", execute_doc, "transaction", transaction,
                         "tm_transaction", tm_transaction_m, "connection", connection_m);
}

static PyMethodDef module_methods[] = {
    {"setup", setup, METH_O,
     PyDoc_STR("setup(ns) -> dict: take the classes, constants and Python fallbacks named in ns; "
               "return the C scope class and the C methods that replace the Python ones")},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "txmanager._onephase",
    PyDoc_STR("The one-phase path's usual case in C (see txmanager.postgres.accelerated)"), -1, module_methods,
};

PyMODINIT_FUNC
PyInit__onephase(void)
{
    if (PyType_Ready(&ScopeType) < 0 || PyType_Ready(&TxScopeType) < 0 || PyType_Ready(&ConnScopeType) < 0)
        return NULL;
    if (intern(&s_local, "_local") || intern(&s_dict, "__dict__") || intern(&s_tx, "tx")
        || intern(&s_closed, "_closed") || intern(&s_idle, "_idle") || intern(&s_settings, "_settings")
        || intern(&s_default_timeout, "default_timeout") || intern(&s_session, "_session")
        || intern(&s_spare, "_spare") || intern(&s_branch, "_branch") || intern(&s_namer, "_namer")
        || intern(&s_pool_return, "_pool_return") || intern(&s_shared_as, "_shared_as")
        || intern(&s_identity, "identity") || intern(&s_share_sessions, "share_sessions")
        || intern(&s_connection, "connection")
        || intern(&s_cursor_factory, "cursor_factory") || intern(&s_get_ts, "get_transaction_status")
        || intern(&s_statusmessage, "statusmessage") || intern(&s_pool_size, "pool_size")
        || intern(&s_finished, "_finished") || intern(&s_tm, "tm") || intern(&s_conn_closed, "closed") || intern(&s_remove, "remove") || intern(&s_close, "close")
        || intern(&s_leave, "_leave_completion") || intern(&s_commit, "commit") || intern(&s_BEGIN, "BEGIN;"))
        return NULL;
    b_COMMIT = PyBytes_FromString("COMMIT");
    O_zero = PyLong_FromLong(0);
    if (b_COMMIT == NULL || O_zero == NULL) return NULL;
    return PyModule_Create(&module_def);
}
