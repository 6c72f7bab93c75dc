"""compile.step_graph's captured bodies (bertaccel/train/step_graph.py), run eagerly on the CPU.

A replay runs exactly the kernels its body launched at capture, so a body that computes the eager
step's bits computes them replayed too. Capture itself needs CUDA (a device run checks it); here
both bodies, the micro + update pair (gradients accumulated into buffers of our own) and the
whole step (fresh gradients, accumulation=1), are held against the loop's eager step over three
optimizer steps: the same weights bit for bit, and the gradients left as each design needs them.
"""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.options.precision import Precision
from bertaccel.train.forward import Forward
from bertaccel.train.step_graph import StepGraphs, _MicroGraph

CPU = torch.device("cpu")
ROWS, LENGTH = 4, 12


def _model():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_labels=3)
    return BertForSequenceClassification(cfg).eval()  # dropout off: both paths compute one function


def _batches():
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(3):
        mask = torch.ones(ROWS, LENGTH, dtype=torch.long)
        mask[0, 7:] = 0  # one padded row: the masked variant, as a compiled run keeps the mask
        out.append({"input_ids": torch.randint(1, 120, (ROWS, LENGTH), generator=g), "attention_mask": mask,
                    "labels": torch.randint(0, 3, (ROWS,), generator=g)})
    return out


def _optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def _eager_steps(model, batches):
    """The loop's step without graphs: loss over the window's n rows, backward, clip, step, zero."""
    forward, opt = Forward(model, Precision("fp32", CPU), CPU, drop_full_mask=False), _optimizer(model)
    n = torch.tensor(float(ROWS))
    for b in batches:
        forward.loss(b, n).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


@pytest.mark.parametrize("whole_step", [True, False], ids=["whole-step", "micro-and-update"])
def test_a_captured_body_computes_the_eager_steps_bits(whole_step):
    batches = _batches()
    reference = _eager_steps(_model(), batches)
    model = _model()
    graphs = StepGraphs(Forward(model, Precision("fp32", CPU), CPU, drop_full_mask=False), _optimizer(model), 1.0,
                        whole_step=whole_step)
    graphs.prepare_gradients()
    g = _MicroGraph(ROWS, LENGTH, True, CPU)  # the static input buffers a graph reads
    graphs.n.fill_(ROWS)
    losses = []
    for b in batches:
        g.load(b)
        losses.append(graphs._body(g))
        if not whole_step:
            graphs._update_body()
    assert all(torch.isfinite(x) and x > 0 for x in losses)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    if whole_step:  # the backward inside the graph makes them afresh: none left between steps
        assert all(p.grad is None for p in model.parameters())
    else:  # accumulated in place: the same buffers, zeroed for the next window
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_whole_step_graphs_refuse_a_window_of_several_micro_batches():
    model = _model()
    graphs = StepGraphs(Forward(model, Precision("fp32", CPU), CPU, drop_full_mask=False), _optimizer(model), 1.0,
                        whole_step=True)
    b = _batches()[0]
    with pytest.raises(RuntimeError, match="windows of one micro-batch, not 2"):
        graphs.step([b, b], 2 * ROWS)


def test_the_run_captures_whole_steps_only_without_accumulation(monkeypatch):
    """Step.capture_graphs' choice: accumulation=1 -> whole_step; k > 1 keeps the micro + update pair.
    (The capture itself, which needs CUDA, is replaced by a note of what would be captured.)"""
    from types import SimpleNamespace

    from bertaccel.train.step import Step

    captured = []
    monkeypatch.setattr(StepGraphs, "capture", lambda self, rows, lengths: captured.append(self.whole_step))
    for k in (1, 2):
        step = Step.__new__(Step)  # only what capture_graphs reads
        step.forward = Forward(_model(), Precision("fp32", CPU), CPU, drop_full_mask=False)
        step.optimizer, step.max_grad_norm = _optimizer(step.forward.module), 1.0
        step.accumulation = SimpleNamespace(first=k)
        step.capture_graphs(ROWS, [LENGTH])
    assert captured == [True, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("whole_step", [True, False], ids=["whole-step", "micro-and-update"])
def test_captured_steps_replay_the_eager_steps_on_a_gpu(whole_step):
    """The capture itself (GPU only): three replayed steps give the eager steps' weights. The capture
    leaves no trace (weights, gradients and optimizer state restored), fresh gradients live in the
    graphs' pool, and the lr is read from the device per replay."""
    gpu = torch.device("cuda")
    batches = [{k: v.to(gpu) for k, v in b.items()} for b in _batches()]
    reference = _model().to(gpu)
    forward = Forward(reference, Precision("fp32", gpu), gpu, drop_full_mask=False)
    opt = torch.optim.AdamW(reference.parameters(), lr=torch.tensor(1e-3, device=gpu), capturable=True, foreach=True)
    n = torch.tensor(float(ROWS), device=gpu)
    for b in batches:
        forward.loss(b, n).backward()
        torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    model = _model().to(gpu)
    graphed = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device=gpu), capturable=True, foreach=True)
    graphs = StepGraphs(Forward(model, Precision("fp32", gpu), gpu, drop_full_mask=False), graphed, 1.0,
                        whole_step=whole_step)
    graphs.capture(ROWS, [LENGTH])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), _model().to(gpu).parameters()))
    losses = [graphs.step([{k: v.cpu().pin_memory() for k, v in b.items()}], ROWS) for b in batches]
    torch.cuda.synchronize()
    assert all(bool(torch.isfinite(x)) for x in losses)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
