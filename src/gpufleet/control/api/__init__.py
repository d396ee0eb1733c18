"""HTTP only: the FastAPI app, its routers per area, the ASGI ingest fast path and body limits."""
