"""The HTTP endpoint: transport-free routes, the threaded server and WSGI/ASGI adapters, OpenAPI.

``app.py`` the routes as one transport-free function: ``Endpoint.handle(Request) -> Response``
``connection_errors.py`` failed connections to the endpoint: counted by reason, logged at a bounded rate
``guards.py`` the edge checks (``Host``, content type, numbers, cursors) and the shared limits (pure)
``openapi.py`` the OpenAPI 3.1 description served at ``/openapi.json``
``server.py`` the threaded server (``serve``), the WSGI and ASGI adapters, a forked worker's server
``workers.py`` whether this process is one of a pre-fork server's workers

Public: ``memprof_otel.Server`` (what ``memprof_otel.serve()`` returns), the routes and their
answers (docs/reference.md, HTTP endpoint), ``memprof_http_connection_errors_total`` and the
``http.*`` config. The module paths are internal.
"""
