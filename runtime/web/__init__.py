"""taskq.web: the HTTP operator API (/api/v1, OpenAPI at /api/v1/openapi.json) and the web dashboard, as
one ASGI application (Starlette, Jinja2, htmx shipped as package data). Needs the extra:
`pip install 'taskq[web]'`. `import taskq` never imports this package.

    taskq web [--host 127.0.0.1] [--port 8765]      # standalone (uvicorn)
    taskq run APP --web-port 8765                    # beside the supervisor
    app.mount("/taskq", taskq.web.create_app(dsn))   # inside an existing ASGI app
"""

from __future__ import annotations

from taskq.web.app import create_app
from taskq.web.state import WebConfig

__all__ = ["WebConfig", "create_app"]
