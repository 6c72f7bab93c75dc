"""Studies by name from any directory: `python -m bertaccel.run -m --config-name thesis_grid`.

The studies (bertaccel/sweeps/*.yaml) are Hydra primary configs beside, not inside, the config
groups (bertaccel/conf). Hydra finds a primary config anywhere on its search path, so this plugin
appends the package's sweeps folder to it, for bertaccel's app only: other Hydra apps in the
same environment see no change. A study's `defaults: [config, ...]` still resolves against
bertaccel/conf, the app's own config folder.
"""
import importlib.util
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


def _sweeps_dir() -> str:
    # Located without importing bertaccel (this runs for every Hydra app of the environment);
    # a plain folder, so file:// rather than pkg:// (bertaccel/sweeps is no Python package).
    spec = importlib.util.find_spec("bertaccel")
    return f"file://{Path(spec.origin).parent / 'sweeps'}"


def _is_bertaccel(search_path: ConfigSearchPath) -> bool:
    # run.py's config_path="conf": Hydra names it pkg://bertaccel/conf (or by file, .../bertaccel/conf)
    return any(e.provider == "main" and e.path is not None and e.path.rstrip("/").endswith("bertaccel/conf")
               for e in search_path.get_path())


class BertaccelSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if _is_bertaccel(search_path):
            search_path.append(provider="bertaccel-sweeps", path=_sweeps_dir())
