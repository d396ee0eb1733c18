"""The REST API's routers, one module per area (meta, nodes, findings and events, policy, tokens,
stream, ingest; jobs in `gpufleet.control.api.routes.jobs`); `gpufleet.control.api.app.create_app`
mounts them under ``/api/v1``. Shared auth and path types live in
`gpufleet.control.api.routes.deps`."""
