"""The documentation site's build: MkDocs hooks and the generators of its reference pages.

Not part of the installed package. ``hooks.py`` is registered in ``mkdocs.yml``; each
generator also runs alone and prints its page (``python -m docsite.cli_reference``).
Generated pages are never committed: they are made from the code at every build, so a
page cannot fall behind the parser, the routes, the metrics or the tables it describes.
"""
