"""The composition root: settings, logging and the command-line interface. No rules live here."""
