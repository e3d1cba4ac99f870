"""Every hop's settings, one model per hop, in the order a request crosses them (SPEC B).

A setting is a field of its hop's model, declared once (:mod:`hopline.budget.declare`); a fixed
value is a named constant of its hop's model. :class:`~hopline.budget.Budget` gathers the models.
"""

from hopline.budget.hops.agent import ContextLimits, ToolLimits
from hopline.budget.hops.edge import ClientSseLimits, DaemonApiLimits, DaemonSseLimits, ReplayLimits
from hopline.budget.hops.gate import GateLimits
from hopline.budget.hops.llm import EngineLimits, GatewayLimits, ProviderLimits
from hopline.budget.hops.pipe import ObserveLimits, PipeLimits
from hopline.budget.hops.state import ClusterLimits, JournalLimits, SidecarLimits

HOP_MODELS = (
    DaemonApiLimits, DaemonSseLimits, ClientSseLimits, ReplayLimits, PipeLimits, ObserveLimits, EngineLimits,
    GatewayLimits, ProviderLimits, ContextLimits, ToolLimits, JournalLimits, SidecarLimits, ClusterLimits,
    GateLimits,
)

__all__ = [
    "HOP_MODELS",
    "ClientSseLimits",
    "ClusterLimits",
    "ContextLimits",
    "DaemonApiLimits",
    "DaemonSseLimits",
    "EngineLimits",
    "GateLimits",
    "GatewayLimits",
    "JournalLimits",
    "ObserveLimits",
    "PipeLimits",
    "ProviderLimits",
    "ReplayLimits",
    "SidecarLimits",
    "ToolLimits",
]
