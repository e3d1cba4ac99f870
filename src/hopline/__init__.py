"""hopline: an agent server in which every hop has a declared, coordinated, measured byte budget."""

# First, before any module of the relay's hot path is imported: their compiled build, when it was
# made from exactly these sources (hopline/compiled.py).
from hopline import compiled as _compiled  # noqa: F401

__version__ = "0.1.0"
