"""How the API is served: the create endpoints' WSGI shortcut and the gunicorn worker class
that reads each request whole before a thread takes it (docs/architecture.md)."""
