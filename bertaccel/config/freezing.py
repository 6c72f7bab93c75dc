"""freezing=<name>: which parameters train in which epoch. Its option: bertaccel/options/freezing.py."""
from __future__ import annotations

from dataclasses import dataclass

FREEZINGS = ("none", "layerwise")


@dataclass
class FreezingConfig:
    """Which parameters train in which epoch. Options in conf/freezing/; bertaccel/options/freezing.py."""
    name: str = "none"  # The strategy: none (every parameter trains) | layerwise (one encoder layer + head per epoch)
