"""The printable forms: what text the control plane stores and prints may look like.

``printable`` (the one definition of printable text, for every path and the API
document), ``text`` (stored text shown on a terminal without letting it act on the
terminal), ``durations`` (durations as operators write them, parsed and printed), ``servers``
(the control plane's replicas as a client is given them, and which one it uses),
``client_limits`` (a client token's limits), ``priority`` (its queue class and share).

The ground floor of the catalog with ``catalog.errors``: imports nothing else of ours,
and nothing heavy (the command line imports it for every command).
"""
