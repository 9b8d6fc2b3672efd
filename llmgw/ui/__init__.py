"""The dashboard's static files (``static/``), served by ``llmgw.api.ui`` under ``/ui``; no code."""
