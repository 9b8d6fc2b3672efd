"""SLO autoscaling: gateways' signal windows in, wanted replicas out, every decision recorded.

The core is pure (``policy``, ``windows``, ``rolling``, ``decide``, ``backtest``, ``steps``); the
edges (``tables``, ``store``, ``runner``, ``loadgen``) do the I/O around it. This
package imports ``catalog`` and ``events`` (for the shared table metadata), never
``scheduler`` or ``llmgw``: the scheduler's daemon is handed a runner by the
composition root.
"""

from autoscale.decide import Decision, Last, Limits, decide
from autoscale.policy import DEFAULT_POLICY, ModelPolicy, Policy, PolicyError, parse_policy
from autoscale.rolling import Rolling, summarise
from autoscale.windows import Summary, Window

__all__ = [
    "DEFAULT_POLICY",
    "Decision",
    "Last",
    "Limits",
    "ModelPolicy",
    "Policy",
    "PolicyError",
    "Rolling",
    "Summary",
    "Window",
    "decide",
    "parse_policy",
    "summarise",
]
