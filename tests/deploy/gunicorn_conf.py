"""gunicorn settings for the deployment tests (what docs/deploy.md recommends)."""

worker_class = "gthread"
threads = 4
graceful_timeout = 10
timeout = 60
# no control socket: several test deployments run at once, and it is one fixed path per user
control_socket_disable = True


def worker_exit(server, worker):  # noqa: ARG001 -- gunicorn's hook signature
    from tests.deploy import app

    app.shutdown()
