"""The control plane's servers as a client (an agent, a gateway) is given them.

Several ``llmgw serve`` replicas share one database, so any of them answers alike.
A client is given them as a list (``--server`` repeated or comma-separated, a TOML
list, ``LLMGW_SERVER="http://a:8080,http://b:8080"``) and *sticks to one*: it moves
to the next, in order and round again, only when the one it uses fails it (no
connection, no answer in time, a 5xx). Sticking, not spreading, keeps a client's
reads consistent with its own writes (one replica's view) and its logs short.

Pure: the rules shared by ``agent`` and ``gateway``, which do the I/O.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable, Sequence

# More servers than this is not a list of replicas but a mistake (or an attack on a
# settings parser): refused with the count.
MAX_SERVERS = 16
MAX_URL = 2048
# With several servers, how long one may take to answer before the client moves on.
# Short: the next replica is as good, and a frozen one (SIGSTOP, a partition) accepts
# connections but never answers. With one server there is nowhere to go, and the
# client's own, longer, timeout applies.
FAILOVER_TIMEOUT_S = 1.0
# The most switches a node report may say (``server_switches``): a move costs at least a
# failed connection, so a count beyond this is corrupt; the agent says at most this.
MAX_SERVER_SWITCHES = (1 << 31) - 1


def parse_servers(raw: object) -> tuple[str, ...]:
    """A list of server URLs from a string (comma-separated) or a list of strings.

    Each must be an ``http`` or ``https`` URL with a host; duplicates are dropped, the
    order kept (the first is where a client starts). Raises ``ValueError`` naming the
    entry and what to write.
    """
    if isinstance(raw, str):
        parts = raw.split(",")
    elif isinstance(raw, list | tuple):
        parts = []
        for item in raw:
            if not isinstance(item, str):
                raise ValueError(f"{str(item)[:60]!r} is not a URL (a list of URL strings)")
            parts.extend(item.split(","))
    else:
        raise ValueError(f"{str(raw)[:60]!r} is not a URL or a list of URLs")
    urls: list[str] = []
    for part in parts:
        url = part.strip().rstrip("/")
        if not url:
            continue
        if len(url) > MAX_URL:
            raise ValueError(f"a server URL is longer than {MAX_URL} characters")
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"{url[:100]!r} is not a server URL: write http://HOST:PORT (several: "
                "comma-separated, or a list)"
            )
        if url not in urls:
            urls.append(url)
        if len(urls) > MAX_SERVERS:
            raise ValueError(f"more than {MAX_SERVERS} servers given")
    if not urls:
        raise ValueError("no server URL given")
    return tuple(urls)


# What a client is told when it moves: (from, to, why).
OnSwitch = Callable[[str, str, str], None]


class ServerList:
    """The server a client uses now, and the next one when it fails (thread-safe)."""

    def __init__(self, urls: Sequence[str], on_switch: OnSwitch | None = None) -> None:
        if not urls:
            raise ValueError("no server URL given")
        self.urls = tuple(urls)
        self._index = 0
        self.on_switch = on_switch
        self._lock = threading.Lock()
        self.switches = 0

    @property
    def current(self) -> str:
        return self.urls[self._index]

    @property
    def several(self) -> bool:
        return len(self.urls) > 1

    def failed(self, url: str, reason: str) -> str:
        """``url`` failed the client: move on from it (if it is still the current one:
        two requests failing together move once) and return the server to use now."""
        with self._lock:
            if not self.several or url != self.current:
                return self.current
            self._index = (self._index + 1) % len(self.urls)
            self.switches += 1
            now = self.current
        if self.on_switch is not None:
            self.on_switch(url, now, reason)
        return now
