"""The HTTP endpoint: transport-free routes, the threaded server and WSGI/ASGI adapters, OpenAPI."""
