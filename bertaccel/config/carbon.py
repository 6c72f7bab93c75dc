"""The carbon block: energy to emissions. Its option: bertaccel/measure/carbon.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class CarbonConfig:
    """How a run's energy becomes emissions: co2e_kg = energy_kwh x hardware.pue x grid intensity /
    1000. Table of regions and checks in bertaccel/measure/carbon.py."""
    # The grid whose carbon intensity counts: a row of carbon.REGIONS (published annual averages)
    region: str = "world"
    # A grid intensity, g CO2e per kWh, used instead of the region's (>= 0: check_carbon)
    intensity_g_per_kwh: Optional[float] = None
