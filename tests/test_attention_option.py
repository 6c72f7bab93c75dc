"""The attention option's one home: conf/attention/<name>.yaml + attention/option.py + swap.BACKENDS."""
import textwrap

import pytest
import torch

from bertaccel.attention.kernels import BACKENDS
from bertaccel.attention.option import attention_unusable
from bertaccel.config import ConfigError
from bertaccel.options.checks import validate

CPU = torch.device("cpu")


def test_adding_an_attention_option_is_one_yaml(compose_cfg, tmp_path):
    # SDPA held to its math kernel (a reference point in a sweep): nothing but the file.
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "sdpa_math.yaml").write_text(textwrap.dedent("""\
        name: sdpa_math
        hf_implementation: sdpa
        swap: null
        sdpa_backends: [MATH]
        """))
    cfg = compose_cfg(["attention=sdpa_math", "model=tiny"], searchpath=tmp_path)
    validate(cfg)
    assert attention_unusable(cfg.attention, CPU) is None
    from bertaccel.attention.packing import MASK_PASSTHROUGH
    from bertaccel.model import build_model

    model, note = build_model(cfg.model, 4, cfg.attention, 128)
    # sdpa over the [B, 1, 1, S] key-padding mask (attention/packing.py), not Hugging Face's
    # [B, 1, S, S] expansion; the same function as eager attention on the same weights.
    assert model.config._attn_implementation == MASK_PASSTHROUGH and "swapped" not in note
    eager = type(model)._from_config(model.config, attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    ids = torch.randint(5, 128, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(input_ids=ids, attention_mask=mask).logits,
                                   eager.eval()(input_ids=ids, attention_mask=mask).logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides, message", [
    (["attention=sdpa", "attention.swap=triton"],
     "attention sdpa: swap=triton replaces the eager BertSelfAttention modules; set hf_implementation=eager"),
    (["attention=eager", "attention.swap=flash9"], f"attention eager: swap='flash9' is not one of {', '.join(BACKENDS)}"),
    (["attention=eager", "attention.hf_implementation=flex"], "attention eager: hf_implementation='flex' is not one of eager, sdpa"),
    (["attention=eager", "attention.sdpa_backends=[MATH]"], "sdpa_backends apply to hf_implementation=sdpa only"),
    (["attention=sdpa", "attention.sdpa_backends=[FAST]"], "attention.sdpa_backends[]='FAST' is not one of"),
])
def test_impossible_attention_settings_fail_in_one_line(compose_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        validate(compose_cfg(overrides))


def test_the_machine_check_is_the_swap_backends_own(compose_cfg):
    import os

    cfg = compose_cfg(["attention=triton"])
    why = attention_unusable(cfg.attention, CPU)
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert why.startswith("attention=triton needs")
    assert attention_unusable(compose_cfg(["attention=eager"]).attention, CPU) is None
