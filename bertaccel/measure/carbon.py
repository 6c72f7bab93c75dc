"""Carbon: a run's co2e_kg from its measured energy, a grid's carbon intensity and the data
centre's PUE. The one home of the `carbon` config block (conf/config.yaml): its settings'
meaning, their checks (CarbonOption, options/registry.py) and their effect (job.py logs co2e_kg).

co2e_kg = energy_kwh x PUE x intensity_g_per_kwh / 1000

- energy_kwh is what the run measured (NVML board energy on a GPU, RAPL package energy on a
  CPU): IT energy only. No energy -> no co2e_kg, null with energy's own reason (never 0).
- PUE (power usage effectiveness, total facility energy / IT energy) is the hardware profile's
  `pue` when it has one: cooling and power delivery of the data centre. A profile without one
  is taken at the IT energy alone, and the source tag says so.
- The intensity is `carbon.intensity_g_per_kwh` when given, else the row of REGIONS that
  `carbon.region` names (default "world"). Grid averages of a year: location-based, not the
  hour the run ran in nor a provider's market-based (contract) figure.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, NamedTuple

from bertaccel.config import CarbonConfig
from bertaccel.measure.collectors import Reading
from bertaccel.option import Option

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


class Intensity(NamedTuple):
    g_per_kwh: float
    source: str  # publication and the year the figure is of


# Annual average grid intensities of 2023 on one basis, so regions compare: Ember's yearly
# electricity data, life-cycle emissions (upstream methane included) in gCO2e per kWh generated,
# as published in thegreenwebfoundation/co2.js data/output/average-intensities.json (June 2024).
# The national agencies' own figures count direct CO2 only and differ in scope (README, Carbon);
# a grid not here, or another basis, is carbon.intensity_g_per_kwh with its source in the run's notes.
_EMBER_2023 = "Ember yearly electricity data, 2023, life-cycle gCO2e/kWh (via co2.js average-intensities.json, 2024-06)"
REGIONS: Mapping[str, Intensity] = {
    "world": Intensity(480.8, f"{_EMBER_2023}: World"),
    "us": Intensity(369.5, f"{_EMBER_2023}: United States"),
    "de": Intensity(381.0, f"{_EMBER_2023}: Germany"),
    "fr": Intensity(56.0, f"{_EMBER_2023}: France"),
    "uk": Intensity(237.6, f"{_EMBER_2023}: United Kingdom"),
}


def check_carbon(carbon: CarbonConfig) -> List[str]:
    """Why the carbon block cannot work, one line each (the profile's pue: options/hardware.py)."""
    found = []
    if carbon.intensity_g_per_kwh is None and carbon.region not in REGIONS:
        found.append(f"carbon.region={carbon.region!r} is not in bertaccel/measure/carbon.py's table; choose one of "
                     f"{', '.join(REGIONS)}, or give carbon.intensity_g_per_kwh=<grams CO2e per kWh> for another grid")
    if carbon.intensity_g_per_kwh is not None and not carbon.intensity_g_per_kwh >= 0:
        found.append(f"carbon.intensity_g_per_kwh={carbon.intensity_g_per_kwh!r} must be >= 0 (grams CO2e per kWh)")
    return found


class CarbonOption(Option):
    section, schema = "carbon", CarbonConfig

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses a region not in REGIONS (unless intensity_g_per_kwh is given) and a negative
        intensity_g_per_kwh (a hardware.pue below 1: the hardware option's, options/hardware.py)."""
        return check_carbon(cfg.carbon)


OPTION = CarbonOption()


def intensity(carbon: CarbonConfig) -> Intensity:
    """The grid intensity this run uses and where it comes from."""
    if carbon.intensity_g_per_kwh is not None:
        return Intensity(float(carbon.intensity_g_per_kwh),
                         f"carbon.intensity_g_per_kwh={carbon.intensity_g_per_kwh:g} (given; carbon.region not used)")
    row = REGIONS[carbon.region]
    return Intensity(row.g_per_kwh, f"carbon.region={carbon.region}: {row.source}")


def co2e(energy: Reading, carbon: CarbonConfig, profile: Mapping[str, Any]) -> Reading:
    """co2e_kg of a run from its energy_kwh reading (see the module's docstring)."""
    if energy.value is None:
        why = energy.source[len("null: "):] if energy.source.startswith("null: ") else energy.source
        return Reading.null(f"energy_kwh unavailable ({why})")
    grid = intensity(carbon)
    pue = profile.get("pue")
    if pue is None:
        pue_part = f"PUE not applied (hardware profile '{profile.get('name')}' has no pue: IT energy only)"
        factor = 1.0
    else:
        factor = float(pue)
        pue_part = f"PUE {factor:g} (hardware profile '{profile.get('name')}'" + (
            f": {profile['pue_source']})" if profile.get("pue_source") else ")")
    value = energy.value * factor * grid.g_per_kwh / 1000.0
    return Reading(value, f"energy_kwh x {pue_part} x {grid.g_per_kwh:g} gCO2e/kWh ({grid.source}) / 1000")
