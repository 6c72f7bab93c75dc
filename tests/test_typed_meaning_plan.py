"""The plan counts an optimizer from its class (its `step_cost`, bertaccel/optimizers/cost.py), so a
new optimizer needs no list in plan/roofline.py; and each option reads itself back from a logged
run (Option.from_params), which is how the plan reads a run's options, not by parsing strings."""
from __future__ import annotations

import pytest


TOY_OPTIMIZERS = '''
import torch
from bertaccel.optimizers.cost import StepCost

class Toy(torch.optim.SGD):
    step_cost = StepCost(5, foreach_ops=3)

class Toy9(torch.optim.SGD):
    step_cost = StepCost(9, foreach_ops=4)

class Bare(torch.optim.SGD):
    pass
'''
# The params a run logs that the roofline reads, a new optimizer's class named by its impl.
TOY_PARAMS = {"precision.autocast_dtype": "null", "attention.hf_implementation": "sdpa", "attention.swap": "null",
              "encoder.layer": "hf", "compile.mode": "off", "optimizer": "toy", "optimizer.max_grad_norm": "null",
              "optimizer.impl._target_": "toy_optimizers.Toy", "optimizer.impl._partial_": "True"}


def test_a_new_optimizer_is_counted_by_the_plan_from_its_class(tmp_path, monkeypatch):
    """A class with a declared step_cost is counted without a list to edit; `foreach: false` runs
    its ops per tensor; a class that declares none is said, not guessed."""
    from bertaccel.optimizers.cost import StepCost
    from bertaccel.plan.roofline import Shape, Trained, Uncounted, count, options

    (tmp_path / "toy_optimizers.py").write_text(TOY_OPTIMIZERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    o = options(TOY_PARAMS)
    assert o.optimizer == StepCost(5, foreach_ops=3)
    assert options({**TOY_PARAMS, "optimizer.impl.foreach": "False"}).optimizer == StepCost(5, per_tensor_ops=3)
    shape = Shape(hidden=4, layers=2, heads=2, intermediate=8)
    t = Trained(params=100, tensors=4, backward_layers=2, embedding_params=0, linear_params=0)
    toy = count(shape, o, 0.0, 1000, 5000, 10, 10, [t])
    toy9 = count(shape, options({**TOY_PARAMS, "optimizer.impl._target_": "toy_optimizers.Toy9"}), 0.0, 1000, 5000,
                 10, 10, [t])
    # 10 steps x (9 - 5) passes x 4 B x 100 parameters; (4 - 3) multi-tensor ops x 2 parameter groups x 10 steps
    assert toy9.memory_bytes - toy.memory_bytes == 10 * 4 * 4 * 100
    assert toy9.kernel_launches - toy.kernel_launches == 1 * 2 * 10
    with pytest.raises(Uncounted, match="toy_optimizers.Bare declares no step_cost"):
        options({**TOY_PARAMS, "optimizer.impl._target_": "toy_optimizers.Bare"})


def test_an_option_reads_itself_back_from_a_logged_run():
    """The logged strings, typed by the section's schema; compile's YAML 1.1 false is off."""
    from bertaccel.options.registry import option

    logged = {"compile.mode": "False", "compile.step_graph": "True", "optimizer.max_grad_norm": "null",
              "optimizer.lr": "0.0002", "optimizer.impl._target_": "torch.optim.AdamW", "optimizer.impl.foreach": "False",
              "train.batch_size": "auto", "train.epochs": "3", "attention.sdpa_backends": '["MATH"]'}
    c, opt, tr, a = (option(s).from_params(logged) for s in ("compile", "optimizer", "train", "attention"))
    assert (c.mode, c.step_graph, c.cache) == ("off", True, "persistent")
    assert (opt.max_grad_norm, opt.lr, opt.impl) == (None, 2e-4, {"_target_": "torch.optim.AdamW", "foreach": False})
    assert (tr.batch_size, tr.epochs, a.sdpa_backends) == ("auto", 3, ["MATH"])


