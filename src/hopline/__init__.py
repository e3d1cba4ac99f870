"""hopline: an agent server in which every hop has a declared, coordinated, measured byte budget."""

__version__ = "0.1.0"
