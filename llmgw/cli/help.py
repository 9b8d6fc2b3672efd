"""Help text conventions: every command's --help ends with examples."""

from __future__ import annotations


def example(*lines: str) -> str:
    """An argparse epilog of example invocations (use RawDescriptionHelpFormatter)."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)
