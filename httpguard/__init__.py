"""Bounded HTTP requests for every server this project runs (API, sim engine, gateway).

uvicorn's httptools parser puts no limit on a request's head: it buffers a
header of any size (copying it as it grows) and any number of headers, and a
connection that sends half a request line is held for ever. This package is the
one place those limits live; a server asks it for uvicorn's settings::

    import uvicorn
    from httpguard import HeadLimits, uvicorn_options

    limits = HeadLimits()  # or HeadLimits(max_connections=..., header_timeout_s=...)
    uvicorn.Config(app, **uvicorn_options(limits), ...)

``uvicorn_options`` gives the guarded protocol class (``http=``) and the idle
keep-alive timeout; nothing else about the server changes. It imports nothing
of this project, so the control plane, the agent's engines and the gateway
can all use it.
"""

from typing import Any

from httpguard.limits import HeadLimits

__all__ = ["HeadLimits", "guarded_protocol", "uvicorn_options"]


def __getattr__(name: str) -> Any:
    # uvicorn is loaded only by a server: commands that read the limits' settings
    # (every `llmgw` command reads llmgw.toml) must not pay for it.
    if name in ("guarded_protocol", "uvicorn_options"):
        from httpguard import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module 'httpguard' has no attribute {name!r}")
