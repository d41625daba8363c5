"""The HTTP endpoint: one route table, transport-free handlers, the threaded server and WSGI/ASGI apps, OpenAPI.

``routes.py`` the route table: a row per method and path (handler, query parameters, its OpenAPI text)
``app.py`` the router and the handlers, transport-free: ``Endpoint.handle(Request) -> Response``
``connection_errors.py`` failed connections to the endpoint: counted by reason, logged at a bounded rate
``guards.py`` the edge checks (``Host``, content type, numbers, cursors) and the shared limits (pure)
``openapi.py`` the OpenAPI 3.1 description served at ``/openapi.json``, written from the route table
``schemas.py`` the JSON Schemas of the documents the routes take and answer
``server.py`` the threaded server (``serve``), the WSGI and ASGI apps, a forked worker's server
``workers.py`` whether this process is one of a pre-fork server's workers

Public: ``memprof_otel.Server`` (what ``memprof_otel.serve()`` returns), the routes and their
answers (docs/reference.md, HTTP endpoint), ``memprof_http_connection_errors_total`` and the
``http.*`` config. The module paths are internal.
"""
