"""Programs and test harnesses that ship with the library but are not the library.

Nothing under :mod:`wsrm_plugin`, :mod:`txmanager` or :mod:`interceptors`
imports this package (a test checks it).  It holds what the ``wsrm`` command
runs and what a user's own tests may borrow:

* :mod:`.demo`, :mod:`.demo_peer` -- ``wsrm demo``, the end-to-end demo;
* :mod:`.proxy` -- ``wsrm proxy``, a lossy loopback HTTP proxy for fault injection;
* :mod:`.pgserver` -- a throwaway PostgreSQL server for tests, demos and benchmarks;
* :mod:`.txdemo`, :mod:`.bank`, :mod:`.crashworker` -- ``wsrm txdemo``, the
  transaction manager's two-bank demo and its SIGKILL workers.

They are a subpackage rather than a top-level folder because the installed
``wsrm`` command runs them from a wheel, where a folder beside the packages
would not exist.
"""
