"""Every study in sweeps/ composes, and every configuration of its grid is valid: no stubs."""
from __future__ import annotations

import itertools
import shutil

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from bertaccel.config import CONF_DIR, SWEEPS_DIR, register_configs
from bertaccel.options.checks import validate

EXPECTED_RUNS = {"quick": 8, "quick_search": 36, "thesis_grid": 24, "seed000_ablation": 8, "seed001_ablation": 5}


@pytest.fixture(scope="module")
def conf_with_sweeps(tmp_path_factory):
    """conf/ and sweeps/*.yaml in one folder: what `--config-dir sweeps` gives the CLI."""
    d = tmp_path_factory.mktemp("conf")
    shutil.copytree(CONF_DIR, d, dirs_exist_ok=True)
    for f in SWEEPS_DIR.glob("*.yaml"):
        shutil.copy(f, d / f.name)
    return d


def _grid(params):
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[f"{o.get_key_element()}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override()
                                                    else [o.value()])] for o in parsed]
    return list(itertools.product(*axes))


def test_every_study_is_in_the_table():
    assert {f.stem for f in SWEEPS_DIR.glob("*.yaml")} == set(EXPECTED_RUNS)


@pytest.mark.slow
@pytest.mark.parametrize("study", sorted(EXPECTED_RUNS))
def test_study_grid_composes_and_validates(conf_with_sweeps, study):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_with_sweeps), version_base="1.3"):
        params = dict(compose(study, return_hydra_config=True).hydra.sweeper.params)
        grid = _grid(params)
        assert len(grid) == EXPECTED_RUNS[study]
        hashes = set()
        for overrides in grid:
            cfg = compose(study, overrides=list(overrides))  # an unknown option would raise here
            validate(cfg)
            hashes.add(str(sorted(overrides)))
        assert len(hashes) == len(grid)
    GlobalHydra.instance().clear()


def test_presets_change_what_the_studies_say(conf_with_sweeps):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_with_sweeps), version_base="1.3"):
        c = compose("seed000_ablation", overrides=["preset=seed000_fused"])
        assert (c.attention.name, c.precision.name, c.compile.mode, c.dataset.max_length) == ("xformers", "fp16", "default", 50)
        top = compose("seed001_ablation", overrides=["preset=seed001_k4_amp_cosine_ckpt"])
        assert (top.accumulation, top.precision.name, top.optimizer.schedule, top.train.gradient_checkpointing) == (
            4, "fp16", "cosine", "sqrt")
        assert (top.optimizer.warmup_ratio, top.optimizer.min_lr_ratio) == (0.05, 0.1)  # seed 001 eq. 10
        base = compose("seed001_ablation", overrides=["preset=none"])
        assert (base.accumulation, base.precision.name, base.optimizer.schedule) == (1, "fp32", "linear")
    GlobalHydra.instance().clear()


@pytest.mark.slow
def test_a_study_is_found_by_name_from_any_directory(cli):
    """The real CLI in a temp directory (no checkout around it): `--config-name <study>` alone."""
    p = cli(["--config-name", "quick", "--cfg", "all"], timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "name: tiny" in p.stdout                             # the study's own settings...
    assert "freezing: none,layerwise" in p.stdout               # ...and its grid
    assert "name: ag_news_sample" in p.stdout                   # on top of bertaccel/conf/config.yaml
