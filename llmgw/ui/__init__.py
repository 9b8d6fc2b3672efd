"""The dashboard's static files (``static/``), served by ``llmgw.api.pages.dashboard`` at ``/ui``.

No code.
"""
