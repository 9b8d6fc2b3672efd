"""Reloading the declared catalog file while the control plane runs.

``llmgw serve`` and ``llmgw daemon`` watch the file (``declared.watch``) and take
a changed one whole or not at all (``declared.reload``); what they made of it is
kept in the database (``declared.status``) for ``llmgw status`` and the API.
"""
