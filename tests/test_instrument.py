"""Zero-code instrumentation in one process: a real DDP module (gloo, world size 1), real torch
hooks, a fake clock advanced by the model, data and optimizer themselves, so every phase has
an exact expected value."""

import contextlib
import enum
import functools
import gc
import math
import os
import subprocess
import sys
import time
import types
import warnings
import weakref

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ddptui
from ddptui.constants import ENDPOINT_ENV, NO_INSTRUMENT_ENV, PHASES
from ddptui.rank import instrument, reporter
from ddptui.rank.net import free_port
from tests.helpers import wait_until


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class Tick(torch.autograd.Function):
    """Identity that spends ``seconds`` of fake time in its forward and its backward."""

    @staticmethod
    def forward(ctx, x, clock, forward_s, backward_s):
        ctx.clock, ctx.backward_s = clock, backward_s
        clock.advance(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.advance(ctx.backward_s)
        return grad, None, None, None


class Net(torch.nn.Module):
    def __init__(self, clock, forward_s=0.010, backward_s=0.020):
        super().__init__()
        self.clock, self.forward_s, self.backward_s = clock, forward_s, backward_s
        self.first = torch.nn.Linear(4, 8)
        self.second = torch.nn.Linear(8, 1)

    def forward(self, x):
        # between the layers: its backward runs before the first layer's gradients arrive
        x = Tick.apply(self.first(x), self.clock, self.forward_s, self.backward_s)
        return self.second(torch.relu(x))


def timed_sgd(params, clock, seconds=0.003):
    """A plain SGD whose step takes ``seconds`` of the fake clock (a per-instance hook, run
    after the global ones). Not a subclass: a subclass's ``step`` calling ``super().step()``
    fires torch's global hooks twice once SGD itself has an instance in the process, so the
    hook counts below would depend on the tests that ran before (see the nested tests)."""
    opt = torch.optim.SGD(params, lr=0.01)
    opt.register_step_pre_hook(lambda optimizer, args, kwargs: clock.advance(seconds))
    return opt


class FakeReporter:
    def __init__(self):
        self.logs = []
        self.evals = []
        self.notes = []
        self.announced = []
        self.times = []
        self.flushes = 0
        self.before = None

    def log(self, **values):
        self.logs.append(values)

    def log_step_at(self, now, wall, **values):
        self.logs.append(values)
        self.times.append((now, wall))

    def log_eval(self, **values):
        self.evals.append(values)

    def note(self, code, **numbers):
        self.notes.append((code, numbers))

    def started(self, **values):
        self.announced.append(values)

    def before_send(self, flush):
        self.before = flush

    def flush(self):
        self.flushes += 1


@pytest.fixture(scope="module")
def process_group():
    if dist.is_initialized():
        yield
        return
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.fixture
def inst(monkeypatch, process_group):
    fake = FakeReporter()
    monkeypatch.setattr(reporter, "get_reporter", lambda: fake)
    # ddptui.log caches the reporter getter: replace (and, after the test, restore) it too.
    monkeypatch.setattr(ddptui, "_get_reporter", lambda: fake)
    instrument.uninstall()
    clock = FakeClock()
    installed = instrument.install(force=True)
    installed.clock = clock
    installed.fake = fake
    installed.fake_clock = clock
    yield installed
    instrument.uninstall()


def fake_module(monkeypatch, name, **attributes):
    """A framework's module (``transformers.trainer``, say) as far as a test needs it: a
    module of ``name`` holding ``attributes``, in ``sys.modules`` for the test only."""
    module = types.ModuleType(name)
    for attribute, value in attributes.items():
        setattr(module, attribute, value)
    monkeypatch.setitem(sys.modules, name, module)


def train_step(model, opt, clock, batch=6, data_s=0.005, between_s=0.0, other_s=0.001):
    clock.advance(data_s)  # waiting for the batch
    x = torch.randn(batch, 4)
    loss = model(x).pow(2).mean()
    clock.advance(between_s)  # loss and the script's own compute before backward
    opt.zero_grad()
    loss.backward()
    clock.advance(other_s)  # e.g. gradient clipping
    opt.step()
    return loss


def test_phases_partition_each_step_exactly(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(3)
    losses = [train_step(model, opt, clock, between_s=0.002).item() for _ in range(4)]
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 4
    for i, (log, loss) in enumerate(zip(logs, losses, strict=True)):
        phases = log["phases"]
        assert set(PHASES) <= set(phases)
        expected = {
            "data": 0.0 if i == 0 else 0.005,  # the first step starts at its forward
            "forward": 0.010,
            "backward": 0.022,  # the loss's own compute (0.002) + backward (0.020)
            "comm": 0.0,  # one rank: nobody to wait for (fake time does not pass)
            "other": 0.001,
            "optimizer": 0.003,
            "eval": 0.0,
        }
        assert phases == pytest.approx(expected, abs=1e-9)
        assert log["step_time"] == pytest.approx(sum(expected.values()), abs=1e-9)
        assert log["samples"] == 6
        assert log["epoch"] == 3
        assert log["loss"] == pytest.approx(loss)


def test_steps_go_from_the_drainer_thread_the_first_one_step_late(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    time.sleep(3 * instrument.SEND_INTERVAL_S)
    assert inst.fake.logs == []  # held until the next step starts: an explicit log may follow
    train_step(model, opt, clock)
    # The first step goes when the second begins; the second within the send interval of
    # its end, from the drainer thread (nothing on the step path): a rank that stalls after
    # a step has reported it.
    assert wait_until(lambda: len(inst.fake.logs) == 2, 5)
    assert inst.fake.flushes >= 1  # the first step goes out at once, not batched
    assert inst._drainer._thread.name == "ddptui-steps"
    assert [now for now, _ in inst.fake.times] == sorted(now for now, _ in inst.fake.times)
    inst.flush()
    assert len(inst.fake.logs) == 2


def test_the_reporter_takes_the_finished_steps_before_any_other_event(inst):
    """An evaluation or the rank's end made after a step reaches ddptui after it: the
    reporter calls the instrumentation's send_ready first (a step ends; ddptui.log_eval
    comes before the drainer's interval is up)."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    for _ in range(2):
        train_step(model, opt, clock)
    inst.flush()
    assert inst.fake.before == inst.send_ready  # registered with the first step sent
    inst._drainer.stop()  # no thread: only send_ready may send now
    train_step(model, opt, clock)
    assert len(inst.fake.logs) == 2
    inst.fake.before()
    assert len(inst.fake.logs) == 3


def test_explicit_log_wins_and_gets_the_phases(inst, monkeypatch):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    fake = inst.fake
    train_step(model, opt, clock)
    ddptui.log(loss=1.5, samples=6)  # the script reports itself
    for _ in range(2):
        train_step(model, opt, clock)
    ddptui.log(loss=1.0)
    ddptui.log(loss=0.5)  # nothing measured since the previous call: no phases
    train_step(model, opt, clock)
    ddptui.log(loss=0.1, phases={"mine": 1.0})  # its own phases win
    inst.flush()
    assert [log.get("loss") for log in fake.logs] == [1.5, 1.0, 0.5, 0.1]
    assert fake.logs[0]["phases"]["forward"] == pytest.approx(0.010)
    assert fake.logs[1]["phases"]["forward"] == pytest.approx(0.020)  # two steps' worth
    assert "phases" not in fake.logs[2]
    assert fake.logs[3]["phases"] == {"mine": 1.0}


@pytest.mark.parametrize(
    ("every", "warmup", "where"),
    [
        (10, 0, "after"),  # every 10th step from the start: the hooks sent some of the ten
        (1, 5, "after"),  # every step, after five steps the hooks sent
        (1, 5, "before"),  # every step, called before its optimizer's step
        (4, 7, "after"),  # every 4th step from the 8th on
    ],
)
def test_the_scripts_first_log_does_not_count_the_steps_the_hooks_sent_again(
    inst, every, warmup, where
):
    """A script that starts calling ``ddptui.log(samples=n)`` while the hooks have already
    sent some of the steps its ``n`` covers: the run's samples are the script's, each once
    (logging every 100th step counted up to 99 steps twice: +0.4 % of a run's samples)."""
    inst._drainer.stop()  # the test says when the hooks' steps go
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    batch, steps, counted = 6, warmup + 3 * every, 0
    for step in range(steps):
        clock.advance(0.005)
        loss = model(torch.randn(batch, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        logs = step >= warmup and (step - warmup) % every == every - 1
        if logs and where == "before":
            ddptui.log(loss=1.0, samples=batch * every)
        opt.step()
        if step == warmup + every // 2 - 1 or (warmup and step == warmup - 1):
            inst.send_ready()  # the drainer's interval came in the middle of the window
        if logs and where == "after":
            ddptui.log(loss=1.0, samples=batch * every)
        counted += batch
    inst.flush()
    assert sum(log.get("samples", 0) for log in inst.fake.logs) == counted


def test_an_evaluation_pass_is_its_own_phase(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    with torch.no_grad():
        model(torch.randn(50, 4))  # 0.010 of fake forward time
    model.eval()
    model(torch.randn(50, 4))  # eval mode, grad enabled: not training either
    model.train()
    train_step(model, opt, clock)
    inst.flush()
    second = inst.fake.logs[1]
    assert second["samples"] == 6
    # the two evaluation forwards (0.010 each) are `eval`, no longer folded into `data`
    assert second["phases"]["eval"] == pytest.approx(0.020)
    assert second["phases"]["data"] == pytest.approx(0.005)
    assert second["phases"]["forward"] == pytest.approx(0.010)
    # evaluating is not training: the step's time (what its rate divides by) is the rest
    trained = sum(second["phases"][p] for p in PHASES if p != "eval")
    assert second["step_time"] == pytest.approx(trained)
    assert trained > 0.02


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("where", ["before", "mid_epoch", "epoch_end"])
def test_an_evaluation_drawn_with_grad_on_and_the_model_training_is_no_pass_of_training(
    inst, where, grad, tmp_path
):
    """facebookresearch/dlrm evaluates every ``--test-freq`` batches, in the middle of its
    training pass and at its end, with grad on and its DDP modules in training mode: a
    pass of forwards over its test loader and never a backward. Its 200 test batches were
    taken for an epoch of their own (2 epochs read ``epoch 4``) and for the next step's
    samples and time (51,456 samples in 7.5 s). A pass of two batches or more with no
    backward, before another loader draws, is an evaluation now: no epoch, no samples, its
    time ``eval``, out of the step's; and the accuracy it logs to TensorBoard then (dlrm's
    ``Test/Acc``), before the training loader draws again, is the evaluation's. Before the
    first step too, where the training loader's iterator may take the dead test one's id
    (it did in a run of this order: the pass is its iterator itself now, held weakly)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train, test = _loader([6] * 4), _loader([50] * 3)

    def evaluate():
        for i, (x, _) in enumerate(test):  # drawn with grad on, the model training
            with torch.set_grad_enabled(grad):  # off around its forwards: minGPT-ddp's
                model(x)  # 10 ms a forward
            if i == 2:  # logged before its iterator goes, whose id the next one takes
                writer.add_scalar("Test/Acc", 0.5, 1)

    if where == "before":
        evaluate()
    for _ in range(2):  # epochs
        for i, (x, _) in enumerate(train):
            clock.advance(0.005)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if (where == "mid_epoch" and i == 1) or (where == "epoch_end" and i == 3):
                evaluate()
    inst.at_exit()  # the last evaluation's accuracy, at the end
    writer.close()
    logs = inst.fake.logs
    assert [log["epoch"] for log in logs] == [0] * 4 + [1] * 4
    evals = [(None, 0.5)] if where == "before" else [(0, 0.5), (1, 0.5)]  # None: no epoch yet
    assert [(e["epoch"], float(e["accuracy"])) for e in inst.fake.evals] == evals
    assert [log["samples"] for log in logs] == [6] * 8
    after = [2, 6] if where == "mid_epoch" else [4]  # the steps after an evaluation
    for step, log in enumerate(logs):
        eval_s = log["phases"]["eval"]
        if step in after and where == "mid_epoch":  # three forwards, their draws' time
            assert eval_s == pytest.approx(0.030)
        else:  # between two passes: no step's time at all
            assert eval_s == 0.0
        trained = sum(log["phases"][p] for p in PHASES if p != "eval")
        assert log["step_time"] == pytest.approx(trained)
        assert log["step_time"] < 0.045


@pytest.mark.parametrize("grad", [True, False])
def test_an_evaluation_pass_does_not_take_back_the_epoch_told_after_it(inst, grad):
    """pytorch/examples' minGPT-ddp shape: each epoch ``set_epoch`` on the training sampler,
    its pass, then ``set_epoch`` on the test sampler and a pass of forwards over it, drawn
    with grad on (the loop turns it off around the forward, or never: dlrm's). Undoing the
    evaluation pass's first batch took the next epoch's ``set_epoch`` back with it: its
    steps read the epoch before (CI read 20 steps of epoch 1, 10 of them epoch 2's). And
    with grad off around the forwards (minGPT-ddp's), the pass was the next step's forward
    (0.6 s of a 0.07 s step, its rate a tenth): an evaluation, as with grad on."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    samplers = [
        torch.utils.data.distributed.DistributedSampler(range(n), num_replicas=1, rank=0)
        for n in (12, 6)
    ]
    train, test = (
        torch.utils.data.DataLoader(
            [torch.randn(4) for _ in range(len(s))], batch_size=3, sampler=s
        )
        for s in samplers
    )
    for epoch in (1, 2):
        samplers[0].set_epoch(epoch)
        for x in train:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        samplers[1].set_epoch(epoch)
        for x in test:
            with torch.set_grad_enabled(grad):
                model(x)
    inst.flush()
    logs = inst.fake.logs
    assert [log["epoch"] for log in logs] == [1] * 4 + [2] * 4
    assert [log["samples"] for log in logs] == [3] * 8
    # The evaluation's two forwards (10 ms each) are not the next epoch's first step's: every
    # step a forward, a backward and an optimizer step (33 ms). Between two passes, as any
    # time there, they are no step's (see test_the_time_between_two_epochs_is_no_steps).
    assert [log["step_time"] for log in logs] == pytest.approx([0.033] * 8, abs=1e-6)
    assert all(log["phases"]["eval"] == 0.0 for log in logs)


def test_batches_of_two_loaders_drawn_before_a_steps_forward_are_no_evaluation(inst):
    """The other side of dlrm's evaluation: a step that draws two batches from one loader
    and one from another before its forward and backward (a pass begun with two draws and no
    forward yet) trains on all three: its pass, epoch and samples stand."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    two, one = _loader([4] * 4), _loader([2] * 6)
    ones = iter(one)
    for _ in range(2):  # epochs of the first loader
        batches = iter(two)
        for first, second in zip(batches, batches, strict=True):
            extra = next(ones)
            opt.zero_grad()
            model(torch.cat([first[0], second[0], extra[0]])).pow(2).mean().backward()
            opt.step()
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [10] * 4
    # (the second loader's first pass counts as one of the passes that number epochs here,
    # where no sampler is told its epoch: one more, the same on every step)
    assert [log["epoch"] - logs[0]["epoch"] for log in logs] == [0, 0, 1, 1]
    assert all(log["phases"]["eval"] == 0.0 for log in logs)


def test_evaluation_batches_are_counted_for_the_heartbeat_and_training_steps_are_not(inst):
    """What a beat says of evaluation (``evaluations``): forwards with grad off or in eval
    mode, before any step too (ImageNet's ``--evaluate``), and batches drawn for them; a
    training step, its loader's batches and its own forwards count nothing."""
    from ddptui.rank import heartbeat

    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    assert instrument.evaluations() == 0
    with torch.no_grad():  # evaluating before any training step
        model(torch.randn(5, 4))
        model(torch.randn(5, 4))
    assert inst.evaluations == 2 and heartbeat.evaluations() == 2
    loader = _loader([3] * 4)
    for x, _ in loader:  # training: its draws and forwards count nothing
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    assert inst.evaluations == 2
    model.eval()
    model(torch.randn(5, 4))  # eval mode, grad on: an evaluation forward too
    model.train()
    with torch.no_grad():
        for x, _ in _loader([2] * 3):  # each batch drawn, and its forward
            model(x)
    assert inst.evaluations == 2 + 1 + 3 * 2
    train_step(model, opt, clock)
    assert inst.evaluations == 9
    instrument.uninstall()
    assert instrument.evaluations() == 0  # no hooks: nothing to say


def test_ddp_modules_in_series_take_the_same_samples_once(inst):
    """facebookresearch/dlrm's bottom and top MLPs are two DDP modules: the bottom one takes
    the rank's 128 of the batch's dense features, the top one the interaction of its output
    with the embeddings (not the bottom one's output itself), 128 rows again: a step read
    256 samples. A step's samples are the most one module took; one module's micro-batches
    still add up."""
    clock = inst.fake_clock
    bottom, top = DistributedDataParallel(Net(clock)), DistributedDataParallel(Net(clock))
    opt = timed_sgd([*bottom.parameters(), *top.parameters()], clock)
    for micro in (1, 1, 2):
        opt.zero_grad()
        for _ in range(micro):
            x = torch.randn(8, 4)
            z = bottom(x).expand(8, 4) + x  # the interaction: another tensor, the same rows
            top(z).pow(2).mean().backward()
        opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [8, 8, 16]


def _second_step_forward(inst):
    """One training step, then the second's data wait (5 ms) and forward: the clock, the
    optimizer, a collective that takes 7 ms (wrapped as torch's are) and the loss."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    collective = inst._collective_wrapper(lambda *a, **k: clock.advance(0.007))
    train_step(model, opt, clock)
    clock.advance(0.005)
    return clock, opt, collective, model(torch.randn(6, 4)).pow(2).mean()


def test_collectives_the_script_calls_are_comm_not_the_phase_they_interrupt(inst):
    """An ImageNet-style loop: a barrier and metric all_reduces between forward and backward."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    assert dist.all_reduce is c10d.all_reduce  # one wrapper under both names
    assert dist.barrier.__wrapped__.__module__ == "torch.distributed.distributed_c10d"
    clock, opt, collective, loss = _second_step_forward(inst)
    collective()  # the barrier: 7 ms
    collective()  # the metrics' all_reduce: 7 ms
    _second_step_has_comm(inst, opt, loss, 0.014)


def _second_step_has_comm(inst, opt, loss, comm):
    """The second step (see :func:`_second_step_forward`) ended: its backward and step, then
    its phases: ``comm`` seconds of comm, its backward's 20 ms as without them."""
    opt.zero_grad()
    loss.backward()
    inst.fake_clock.advance(0.001)
    opt.step()
    inst.flush()
    second = inst.fake.logs[1]
    assert second["phases"]["comm"] == pytest.approx(comm)
    assert second["phases"]["backward"] == pytest.approx(0.020)  # as without them
    assert sum(second["phases"][p] for p in PHASES) == pytest.approx(second["step_time"])


def test_a_loss_the_script_changes_after_its_step_is_read_as_it_was_at_the_step(inst):
    """facebookresearch/pycls all-reduces each step's loss in place after the optimizer's
    step (a sum, then times 1/ranks) for its log. The drainer read the tensor later, racing
    that: a rank's own loss, the ranks' mean or, between the two, their sum, step to step
    (one step read 3.6318 on rank 1 and 1.8159 on rank 0). Read when the step ends, as a
    GPU's loss is copied then."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    owns = []
    for _ in range(3):
        loss = train_step(model, opt, clock)
        owns.append(loss.item())
        with torch.no_grad():
            loss.mul_(2.0)  # the all-reduce's sum over two ranks, before its scaling
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(owns)


def test_waiting_on_an_async_collectives_work_is_comm(inst):
    """``dist.all_reduce(t, async_op=True)`` returns at once; the wait is in ``work.wait()``
    (facebookresearch/pycls's loss and errors): that wait is ``comm``, as a collective's call
    is, not the phase it interrupts, and ``Work.wait`` is ddptui's for it."""
    import torch.distributed.distributed_c10d as c10d

    from ddptui.rank import frames

    assert c10d.Work.wait.__name__ == frames.ASYNC_WAIT
    clock, opt, collective, loss = _second_step_forward(inst)
    wait = inst._wait_wrapper(lambda work: clock.advance(0.009) or True)
    assert wait(object()) is True  # the work's wait: 9 ms, what the original returns
    _second_step_has_comm(inst, opt, loss, 0.009)


def test_a_collective_another_thread_calls_is_not_the_steps_comm(inst):
    """A collective called from another thread while the step computes (a compression hook's
    callback, an async checkpoint's): the stepping thread did not wait in it. Timed, it was
    counted as the step's comm and moved its backward's start (and a collective of the step's
    own, called while the other thread's was in progress, went untimed)."""
    import threading

    clock, opt, collective, loss = _second_step_forward(inst)
    elsewhere = threading.Thread(target=collective)
    elsewhere.start()
    elsewhere.join()
    opt.zero_grad()
    loss.backward()
    collective()  # the script's own, after backward: comm
    clock.advance(0.001)
    opt.step()
    inst.flush()
    second = inst.fake.logs[1]
    assert second["phases"]["comm"] == pytest.approx(0.007)  # its own collective only
    # the 7 ms this thread spent joining the other is the segment's it was in, as other work
    assert second["phases"]["backward"] == pytest.approx(0.027)
    assert sum(second["phases"][p] for p in PHASES) == pytest.approx(second["step_time"])


def test_gradient_accumulation_sums_samples_and_averages_losses(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        for batch in (4, 5):
            clock.advance(0.005)
            loss = model(torch.randn(batch, 4)).pow(2).mean()
            loss.backward()
            losses.append(loss.item())
        opt.step()
    inst.flush()
    first, second = inst.fake.logs
    assert first["samples"] == second["samples"] == 9
    assert second["loss"] == pytest.approx((losses[2] + losses[3]) / 2)
    assert second["phases"]["forward"] == pytest.approx(0.020)
    assert second["phases"]["backward"] == pytest.approx(0.040)
    assert second["phases"]["data"] == pytest.approx(0.010)  # both micro-batches' waits


class DispatchingTensor(torch.Tensor):
    """A tensor subclass that passes every torch call through ``__torch_function__``, as
    fastai's ``TensorBase`` (its losses) does."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_loss_is_read_once_per_backward(inst):
    """Its ``backward`` enters ``Tensor.backward`` twice (the second through its dispatch):
    fastai's losses were read twice and added, 5.54 where its learner had 2.77."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    losses = []
    calls = []
    data = torch.utils.data.TensorDataset(torch.randn(18, 4))
    for (x,) in torch.utils.data.DataLoader(data, batch_size=6):  # a batch: one objective
        opt.zero_grad()
        clock.advance(0.005)
        loss = model(x).pow(2).mean().as_subclass(DispatchingTensor)
        calls.append(inst.hook_calls)
        loss.backward()
        calls[-1] = inst.hook_calls - calls[-1]
        losses.append(loss.item())
        opt.step()
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs[1:]] == pytest.approx(losses[1:])
    assert inst.fake.logs[-1]["samples"] == 6
    assert inst.fake.logs[-1]["phases"]["backward"] == pytest.approx(0.020)
    assert calls[-1] == 2  # the backward wrapper once, the one gradient hook left


@pytest.fixture(scope="module")
def rpc_world():
    """This process as a world of one over torch's RPC (TensorPipe on loopback)."""
    from torch.distributed import rpc

    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{free_port()}")
    rpc.init_rpc("trainer0", rank=0, world_size=1, rpc_backend_options=options)
    yield rpc
    rpc.shutdown()


@pytest.mark.filterwarnings("ignore:`TorchScript` support for functional optimizers")
@pytest.mark.filterwarnings("ignore:You are using a Backend")
@pytest.mark.parametrize(("roots", "optimizer"), [(1, "SGD"), (2, "ASGD")])
def test_distributed_autograd_and_optimizer_steps_are_steps(inst, rpc_world, roots, optimizer):
    """pytorch/examples' ``ddp_rpc``: a DDP module trained with ``dist_autograd.backward``
    and a ``DistributedOptimizer`` (neither ``Tensor.backward`` nor a torch.optim step on the
    trainer) read "preparing" and 0 samples for its 1,000 steps a trainer. Two roots of one
    backward are the terms of one objective: the step's loss is their sum. SGD's owners step
    a functional optimizer (TorchScript); ASGD's a torch.optim one, here in an RPC thread of
    this process, inside the DistributedOptimizer's step: the same step, not another."""
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer

    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = DistributedOptimizer(
        getattr(torch.optim, optimizer), [rpc_world.RRef(p) for p in model.parameters()], lr=0.01
    )
    losses = []
    for _ in range(4):
        clock.advance(0.005)
        with dist_autograd.context() as context_id:
            out = model(torch.randn(6, 4))
            terms = [out.pow(2).mean(), out.abs().mean()][:roots]
            dist_autograd.backward(context_id, terms)
            opt.step(context_id)
        losses.append(sum(t.item() for t in terms))
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 4
    assert [log["loss"] for log in logs] == pytest.approx(losses)
    assert [log["samples"] for log in logs] == [6] * 4
    assert logs[-1]["phases"]["forward"] == pytest.approx(0.010)
    assert logs[-1]["phases"]["backward"] == pytest.approx(0.020)
    assert logs[-1]["phases"]["data"] == pytest.approx(0.005)


def test_gradient_hooks_shrink_to_the_last_parameter(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    for _ in range(instrument.LEARN_STEPS + 2):
        train_step(model, opt, clock)
    (watch,) = inst._watches.values()
    assert len(watch.params) == 4 and len(watch.handles) == 1
    kept = watch.params[watch.kept]
    assert kept is model.module.first.weight or kept is model.module.first.bias
    calls = inst.hook_calls
    train_step(model, opt, clock)
    # outer pre, inner pre/post, one gradient hook, backward, optimizer pre/post: DDP's own
    # post hook went once the inner one had closed a forward
    assert inst.hook_calls - calls == 7
    assert not model._forward_hooks
    inst.flush()
    assert inst.fake.logs[-1]["phases"]["backward"] == pytest.approx(0.020)


def test_two_training_loaders_drawn_each_step_count_both_and_the_larger_ones_epoch(inst):
    """kekmodel/FixMatch-pytorch: each step draws a labeled batch (4) and an unlabeled one
    (two views of 8 images) from two loaders, each with its DistributedSampler, restarted
    when it runs out with ``set_epoch(its own count)``, and runs one forward over all 20
    inputs. ddptui counted only the last loader's batch (8 of the step's 12 images) and its
    epoch followed whichever sampler was told last (the labeled one's, 7 at the script's
    second epoch of 2). Now a step's samples are every training loader's batches in it
    (bounded by its DDP forwards), and the epoch is the larger sampler's."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)

    def loader(n, batch):
        data = torch.utils.data.TensorDataset(torch.randn(n, 4))
        sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=1, rank=0)
        return torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)

    labeled, unlabeled = loader(8, 4), loader(48, 8)
    epochs = {"l": 0, "u": 0}
    labeled.sampler.set_epoch(0)
    unlabeled.sampler.set_epoch(0)
    iters = {"l": iter(labeled), "u": iter(unlabeled)}

    def draw(name, source):
        try:
            return next(iters[name])
        except StopIteration:
            epochs[name] += 1
            source.sampler.set_epoch(epochs[name])
            iters[name] = iter(source)
            return next(iters[name])

    for _ in range(9):
        (x,) = draw("l", labeled)
        (u,) = draw("u", unlabeled)
        opt.zero_grad()
        model(torch.cat((x, u, u + 1))).pow(2).mean().backward()
        opt.step()
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [12] * 9
    # the labeled sampler's passes come every 2 steps, the unlabeled one's every 6
    assert [log["epoch"] for log in logs] == [0] * 6 + [1] * 3


@pytest.mark.parametrize("part", ["whole", "slice"])
def test_the_first_batch_is_noted_as_the_first_training_forward_takes_it(inst, monkeypatch, part):
    """facebookresearch/dlrm draws the whole global batch on every rank (its embedding
    tables are split over the ranks) and feeds its DDP modules the rank's slice of it; its 2
    CPU ranks, the same batch drawn, were told that they "compute the same gradients and 2 do
    the work of one". The first batch's note goes out at the first training forward now, its
    digest with the forward's inputs: the whole batch on two ranks, one digest; each its own
    slice, two (the rule on a GPU: tests/test_same_batches.py)."""
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # as the digest sees it
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4))

    def noted():
        return [numbers["digest"] for code, numbers in inst.fake.notes if code == "first_batch"]

    for rank in range(2):  # the two ranks' first steps, as each would take them
        inst._batch_noted = False
        torch.manual_seed(0)  # one seed on every rank: the same batches
        (x,) = next(iter(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)))
        assert len(noted()) == rank  # not at the draw: at the forward
        opt.zero_grad()
        model(x[rank * 4 : rank * 4 + 4] if part == "slice" else x).pow(2).mean().backward()
        opt.step()
        assert len(noted()) == rank + 1
    first, second = noted()
    assert (first == second) == (part == "whole")


def test_modules_frozen_and_thawed_by_phase_keep_their_steps(inst):
    """NVlabs/stylegan2-ada-pytorch thaws each network only for its own phase
    (``requires_grad_(True)`` before, ``(False)`` after) and runs the other one frozen: the
    discriminator's first forward comes while it is frozen, and the generator's kept hook
    was re-armed while it was. torch refuses a hook on a parameter that requires no
    gradient, and that error turned ddptui's step instrumentation off: 1 step of 32. Every
    iteration is a step, and both modules' gradient hooks are learned and pruned."""
    clock = inst.fake_clock
    netG, netD = DistributedDataParallel(Net(clock)), DistributedDataParallel(Net(clock))
    optG, optD = timed_sgd(netG.parameters(), clock), timed_sgd(netD.parameters(), clock)
    netG.requires_grad_(False)
    netD.requires_grad_(False)
    iterations = instrument.LEARN_STEPS + 4
    for x, _ in _loader([4] * iterations):
        for opt, net in ((optG, netG), (optD, netD)):
            opt.zero_grad(set_to_none=True)
            net.requires_grad_(True)
            fake = netG(x)
            if net is netD:
                fake = fake.detach()
            netD(fake.expand(-1, 4)).pow(2).mean().backward()
            net.requires_grad_(False)
            opt.step()
    inst.flush()
    assert not inst.disabled
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [4] * iterations
    assert logs[-1]["phases"]["backward"] > 0
    assert sorted(len(watch.handles) for watch in inst._watches.values()) == [1, 1]


def test_a_module_frozen_for_good_is_looked_at_a_bounded_number_of_times(inst):
    """Until a hook fires, each training forward looks for parameters thawed since; a module
    frozen for good (an encoder frozen after some epochs) stops being looked at."""
    layer = torch.nn.Linear(4, 2).requires_grad_(False)
    watch = instrument._GradWatch(inst, list(layer.parameters()))
    assert watch.thawing and watch.handles == {}
    forwards = 0
    while watch.thawing:
        watch.arm_thawed()
        forwards += 1
    assert forwards == instrument.MAX_THAW_CHECKS - 1  # the arming itself looked once
    layer.weight.requires_grad_(True)
    watch.arm_all()  # a re-arming looks again, and hooks what is thawed
    assert set(watch.handles) == {0} and watch.thawing


def test_a_ddp_forward_the_script_calls_itself_is_timed_as_ddps(inst):
    """facebookresearch/vicreg calls ``loss = model.forward(x, y)`` on its DDP module: no
    module hook of DDP's runs. DDP's pre-forward work (its buffers' broadcast, where a rank
    waits for a slower peer) read as ``other``; with rank 1 asleep 3 s before each forward,
    both ranks read 33 % ``other`` and no straggler was named, where ``model(x, y)`` read
    rank 0's wait as ``comm`` and rank 1 a straggler. From its second forward on (the first
    finds it out) such a module is timed as DDP's call is, whichever way it is called; the
    hook calls a step stay as many."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    pre_forward = model._pre_forward

    def waiting(*args, **kwargs):  # DDP's buffer broadcast, waiting for the slower rank
        clock.advance(0.050)
        return pre_forward(*args, **kwargs)

    model._pre_forward = waiting
    calls = []
    for _ in range(4):
        clock.advance(0.005)
        before = inst.hook_calls
        loss = model.forward(torch.randn(6, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        calls.append(inst.hook_calls - before)
    clock.advance(0.005)
    train_step(model, opt, clock, data_s=0.0)  # called as a module: the same, once each
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [6] * 5
    first, *rest, called = [log["phases"] for log in logs]
    assert first.get("comm", 0.0) == 0  # the first forward: found out there
    for phases in [*rest, called]:
        assert phases["comm"] == pytest.approx(0.050)
        assert phases["forward"] == pytest.approx(0.010)
    assert [phases.get("other", 0.0) for phases in rest] == pytest.approx([0.0] * 3)
    # its forward's pre and post, the inner pre and post, a gradient hook, backward, the
    # optimizer's pre and post (a DDP module called as one: 7, its post hook removed)
    assert calls[-1] == 8
    model._pre_forward = pre_forward
    inst.detach()
    assert DistributedDataParallel.forward.__module__ == "torch.nn.parallel.distributed"


def test_custom_phases_ride_with_the_step(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    with ddptui.phase("augment"):
        clock.advance(0.004)
    train_step(model, opt, clock)
    for i in range(instrument.MAX_CUSTOM_PHASES + 3):
        with ddptui.phase(f"p{i}"):
            pass
    train_step(model, opt, clock)
    inst.flush()
    first, second = inst.fake.logs
    assert first["phases"]["augment"] == pytest.approx(0.004)
    assert sum(first["phases"][p] for p in PHASES) == pytest.approx(first["step_time"])
    assert len([k for k in second["phases"] if k.startswith("p")]) == instrument.MAX_CUSTOM_PHASES
    assert inst.phases_ignored == 3


def test_phase_is_a_no_op_without_instrumentation():
    instrument.uninstall()
    with ddptui.phase("anything") as p:
        pass
    assert p is ddptui._NO_PHASE


class FakeEvent:
    """A CUDA event on a fake device whose clock is the test's: it completes when told."""

    def __init__(self, clock, done):
        self.clock, self.done, self.t = clock, done, None

    def record(self, stream=None):
        self.t = self.clock.now

    def query(self):
        return self.done[0]

    def elapsed_time(self, end):
        assert self.done[0], "read before the device passed the event: a synchronisation"
        return (end.t - self.t) * 1000.0


class FakeCuda:
    def __init__(self, clock, done):
        self.Event = lambda enable_timing=False: FakeEvent(clock, done)
        self.current_stream = lambda device=None: "stream"


class FakeTorch:
    """torch with a fake ``cuda`` namespace: exercises the GPU timing path on CPU."""

    def __init__(self, clock, done):
        self.cuda = FakeCuda(clock, done)

    def __getattr__(self, name):
        return getattr(torch, name)


def test_gpu_phases_come_from_events_read_only_once_complete(inst):
    clock = inst.fake_clock
    done = [False]
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    inst.torch = FakeTorch(clock, done)
    inst._cuda = "cuda:0"  # as if the DDP module's parameters lived on a GPU
    losses = [train_step(model, opt, clock, between_s=0.002).item() for _ in range(3)]
    assert inst.fake.logs == []  # the device has not passed the events: nothing is read
    done[0] = True
    train_step(model, opt, clock, between_s=0.002)
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 4
    for i, log in enumerate(logs):
        expected = {
            "data": 0.0 if i == 0 else 0.005,
            "forward": 0.010,
            "backward": 0.022,
            "comm": 0.0,
            "other": 0.001,
            "optimizer": 0.003,
            "eval": 0.0,
        }
        assert log["phases"] == pytest.approx(expected, abs=1e-9)
        assert log["step_time"] == pytest.approx(sum(expected.values()), abs=1e-9)
    assert [log["loss"] for log in logs[:3]] == pytest.approx(losses)  # host losses: read now


def test_on_a_gpu_an_evaluation_pass_is_out_of_the_steps_time_not_out_of_its_phases(inst):
    """GPU phases are the device's time: an evaluation's kernels between two steps are in
    the next step's ``data``, as the device ran them; the step's time (what its rate divides
    by) leaves out the pass's host time, as on the CPU."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    inst.torch = FakeTorch(clock, [True])
    inst._cuda = "cuda:0"
    train_step(model, opt, clock)
    with torch.no_grad():
        model(torch.randn(50, 4))  # 0.010 of fake forward time
        model(torch.randn(50, 4))
    train_step(model, opt, clock)
    inst.flush()
    second = inst.fake.logs[1]
    assert second["phases"]["data"] == pytest.approx(0.005 + 0.020)
    assert second["phases"]["eval"] == 0.0
    assert second["step_time"] == pytest.approx(sum(second["phases"].values()) - 0.020)


def test_on_a_gpu_every_micro_batch_is_in_the_loss_and_at_most_max_losses_go_to_the_host(
    inst, monkeypatch
):
    """Gradient accumulation over more micro-batches than MAX_LOSSES on a GPU: the losses are
    folded into their sum on the device as they come, so that the step's loss is the mean of
    all of them (nanoGPT's 40) while no more than MAX_LOSSES copies go to the host."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    inst.torch = FakeTorch(clock, [True])
    inst._cuda = "cuda:0"
    copies = []
    to_host = inst._to_host
    monkeypatch.setattr(inst, "_to_host", lambda value: copies.append(value) or to_host(value))
    micro, undivided = 2 * instrument.MAX_LOSSES + 5, []
    for _ in range(micro):
        loss = model(torch.randn(3, 4)).pow(2).mean()
        undivided.append(loss.item())
        (loss / micro).backward()
    opt.step()
    inst.flush()
    assert inst.fake.logs[-1]["loss"] == pytest.approx(sum(undivided) / micro)
    assert len(copies) <= instrument.MAX_LOSSES


def test_on_the_cpu_every_micro_batch_is_in_the_loss_read_as_its_backward_began(inst):
    """A CPU's losses are kept as their values, read as each backward begins: more
    micro-batches than MAX_LOSSES are folded into their sum all the same, and a loss the
    script changes in place after its backward (before the optimizer's step) reads as it
    was backwarded."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    micro, undivided = 2 * instrument.MAX_LOSSES + 5, []
    for _ in range(micro):
        loss = model(torch.randn(3, 4)).pow(2).mean()
        undivided.append(loss.item())
        (loss / micro).backward()
        with torch.no_grad():
            loss.mul_(1000.0)
    assert len(inst._losses) <= instrument.MAX_LOSSES
    opt.step()
    clock.advance(0.005)
    loss = model(torch.randn(3, 4)).pow(2).mean()
    backwarded = loss.item()
    loss.backward()
    with torch.no_grad():
        loss.zero_()
    opt.step()
    inst.flush()
    assert backwarded != 0.0
    assert [log["loss"] for log in inst.fake.logs[-2:]] == pytest.approx(
        [sum(undivided) / micro, backwarded]
    )


def test_a_lone_loss_is_not_read_for_its_divisor_until_a_step_has_several(inst, monkeypatch):
    """Reading what a loss was divided by walks its graph (5.5 us of a 3 ms step): not done
    for a step's first loss while every step had one; the first step that accumulates
    (``loss / 4``, four micro-batches) reads its others' and takes the first's as theirs, and
    from then on every loss's is read."""
    read = []
    divisor = instrument._divisor
    monkeypatch.setattr(instrument, "_divisor", lambda loss: read.append(1) or divisor(loss))
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    expected = []
    for micro in (1, 1, 4, 4):
        clock.advance(0.005)
        undivided = []
        for _ in range(micro):
            loss = model(torch.randn(3, 4)).pow(2).mean()
            undivided.append(loss.item())
            (loss / micro).backward()
        opt.step()
        expected.append(sum(undivided) / micro)
        if micro == 1:
            assert read == []
    assert len(read) == 3 + 4
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(expected)


def test_losses_that_cannot_be_folded_leave_the_first_ones_to_stand_for_the_step(inst):
    """A step's losses on two devices cannot be stacked into one sum: the first MAX_LOSSES
    stand for the step, as before folding, and nothing raises on the step's path."""
    first = [torch.tensor(float(i)) for i in range(instrument.MAX_LOSSES - 1)]
    first.append(torch.tensor(7.0, device="meta"))
    for value in [*first, torch.tensor(100.0)]:
        inst._loss_count += 1
        inst._keep_loss(value, None)
    assert inst._losses == first and inst._folded == 0  # the ninth is not kept
    assert not inst.disabled
    assert inst._loss_divisors == [None]  # each divisor once
    inst._forget_losses()
    distinct = inst._loss_divisors
    for divisor in range(2 * instrument.MAX_LOSSES):
        inst._keep_loss(torch.tensor(1.0), float(divisor))
    assert len(distinct) == instrument.MAX_LOSSES + 1  # more cannot all be the count


@pytest.mark.parametrize("passed", [False, True], ids=["on the device", "passed"])
def test_gpu_steps_beyond_the_pending_limit_go_without_phases_only_while_on_the_device(
    inst, monkeypatch, passed
):
    """More GPU steps wait than the limit: while the device has not passed their events, the
    oldest go without phases (their own samples); fast steps with the device keeping up fill
    more than the limit in one drainer interval, and each goes with its phases and loss."""
    monkeypatch.setattr(instrument, "MAX_PENDING", 2)
    inst._drainer.stop()  # no thread: only send_ready sends, so the queue is as the test made it
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    inst.torch = FakeTorch(clock, [passed])
    inst._cuda = "cuda:0"
    losses = [train_step(model, opt, clock, batch=b).item() for b in (3, 4, 5, 6)]
    inst.send_ready()  # what the drainer thread does within its interval
    logs = inst.fake.logs
    if not passed:  # the oldest, sent when no room was left
        assert [(log["samples"], log["phases"]) for log in logs] == [(3, None), (4, None)]
        assert [entry[1] for entry in inst._pending] == [5, 6]
        return
    assert [log["samples"] for log in logs] == [3, 4, 5, 6]
    assert all(log["phases"] is not None for log in logs)
    assert [log["loss"] for log in logs] == pytest.approx(losses)


def _fast_steps(inst, n, epochs=None, slow=()):
    """``n`` steps of 0.8 ms of the fake clock (0.5 ms the first: no data before it); each
    step's loss and batch size. ``epochs``: the epoch each step is in; ``slow``: the steps
    that take 6 ms more. One model and optimizer for each ``inst`` (a new one, with no
    DataLoader, would step its first step in the last one's iteration: see _joins)."""
    clock = inst.fake_clock
    if not hasattr(inst, "fast_net"):
        model = DistributedDataParallel(Net(clock, forward_s=0.0001, backward_s=0.0002))
        inst.fast_net = (model, timed_sgd(model.parameters(), clock, seconds=0.0001))
    model, opt = inst.fast_net
    losses = []
    for i in range(n):
        if epochs is not None:
            inst._epoch = epochs[i]
        batch = 3 + i % 4
        between = 0.006 if i in slow else 0.0
        loss = train_step(
            model, opt, clock, batch=batch, data_s=0.0003, between_s=between, other_s=0.0001
        )
        losses.append((loss.item(), batch))
    return losses


def test_very_fast_steps_go_a_few_at_a_time_with_their_sums_and_mean_loss(inst, monkeypatch):
    """Steps under MERGE_BELOW_S found ready together go as one event of up to MERGE_S of
    their time: how many it holds, their samples, time and phases summed, the last one's
    loss (a step's own, at its number). The first step goes alone (the rank's first sign of
    training). Only the losses sent are made from their values: one an event."""
    made = []
    host_loss = instrument._host_loss
    monkeypatch.setattr(instrument, "_host_loss", lambda *a: made.append(a) or host_loss(*a))
    inst._drainer.stop()  # no thread: the steps wait until the flush, as in a busy interval
    steps = _fast_steps(inst, 70)
    inst.flush()
    logs = inst.fake.logs
    counts = [log.get("steps", 1) for log in logs]
    assert counts[0] == 1 and sum(counts) == 70 and len(logs) < 10
    assert len(made) == len(logs)  # not 70
    assert sum(log["samples"] for log in logs) == sum(batch for _, batch in steps)
    at = 0
    for log, count in zip(logs, counts, strict=True):
        mine = steps[at : at + count]
        at += count
        assert log["samples"] == sum(batch for _, batch in mine)
        assert log["loss"] == mine[-1][0]
        assert log["step_time"] == pytest.approx(sum(log["phases"].values()))
        assert log["step_time"] <= instrument.MERGE_S + 1e-12
        if count > 1:
            assert log["step_time"] == pytest.approx(0.0008 * count)
    for log, following in zip(logs[1:-1], logs[2:], strict=True):  # full but the last
        one = following["step_time"] / following["steps"]
        assert log["step_time"] + one > instrument.MERGE_S


def test_fast_gpu_steps_go_a_few_at_a_time_once_the_device_has_passed_them(inst):
    """On a GPU the steps are grouped as they become readable: their device phases summed,
    the last one's loss, nothing read before the device has passed it."""
    inst._drainer.stop()
    done = [False]
    inst.torch = FakeTorch(inst.fake_clock, done)
    inst._cuda = "cuda:0"
    steps = _fast_steps(inst, 12)
    inst.send_ready()
    assert inst.fake.logs == []  # on the device still
    done[0] = True
    inst.flush()
    logs = inst.fake.logs
    assert [log.get("steps", 1) for log in logs] == [1, 11]
    assert logs[1]["loss"] == steps[-1][0]
    assert logs[1]["samples"] == sum(batch for _, batch in steps[1:])
    assert sum(logs[1]["phases"].values()) == pytest.approx(0.0008 * 11)


def test_fast_steps_of_two_epochs_or_slow_ones_go_apart(inst, monkeypatch):
    """An event's steps are of one epoch; a step of MERGE_BELOW_S or more goes alone, after
    the steps before it (it went ahead of them once: their losses a group late)."""
    inst._drainer.stop()
    _fast_steps(inst, 9, epochs=[0, 0, 0, 0, 1, 1, 1, 1, 1])
    inst.flush()
    assert [(log["epoch"], log.get("steps", 1)) for log in inst.fake.logs] == [
        (0, 1), (0, 3), (1, 5),
    ]  # fmt: skip
    inst.fake.logs.clear()
    steps = _fast_steps(inst, 8, slow=(3, 6))  # a slow step ends the group before it
    inst.flush()
    logs = inst.fake.logs
    assert [log.get("steps", 1) for log in logs] == [3, 1, 2, 1, 1]
    assert [log["loss"] for log in logs] == [steps[i][0] for i in (2, 3, 5, 6, 7)]
    monkeypatch.setattr(instrument, "MERGE_BELOW_S", 0.0008)  # the steps are 0.8 ms
    inst.fake.logs.clear()
    _fast_steps(inst, 4)
    inst.flush()
    assert [log.get("steps", 1) for log in inst.fake.logs] == [1, 1, 1, 1]


def test_cpu_steps_beyond_the_gpu_pending_limit_keep_their_loss_and_phases(inst, monkeypatch):
    """Many fast CPU steps in one drainer interval: their values are on the host, and each
    goes with its loss and phases. Only beyond the host bound do the oldest go without."""
    monkeypatch.setattr(instrument, "MAX_PENDING", 2)
    monkeypatch.setattr(instrument, "MAX_PENDING_HOST", 5)
    inst._drainer.stop()  # no thread: only send_ready sends, so the queue is as the test made it
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    losses = [train_step(model, opt, clock, batch=b).item() for b in (3, 4, 5, 6, 7, 8, 9)]
    inst.send_ready()  # what the drainer thread does within its interval
    # Seven queued, five at most: the two oldest go without values, the rest with theirs.
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [3, 4, 5, 6, 7, 8, 9]
    assert [log["phases"] is None for log in logs] == [True, True] + [False] * 5
    assert [log["loss"] for log in logs] == pytest.approx([None, None, *losses[2:]])


@pytest.mark.parametrize(
    "consumed", ["set_to_none", "zeroed", "by_hand", "by_hand_zeroed_after_forward", "kept"]
)
def test_a_ddp_loop_without_an_optimizer_step_ends_a_step_where_its_gradients_go(inst, consumed):
    """A throughput loop of forward and backward only (kyoungseoun-chung's
    pytorch-distributed-cpu: zero_grad, forward, backward, no step) or weights updated by
    hand: each backward whose gradients (or weights) the next iteration finds consumed (or
    updated) is a step, ended at the backward's return; the last one when the process ends.
    A loop that zeroes after its forward (forward, ``model.zero_grad()``, backward, update)
    read no step at all before. Gradients kept (a loop that accumulates and never steps) end
    none: that is one step still under way."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(4):
        clock.advance(0.005)  # the batch
        if consumed == "set_to_none":
            opt.zero_grad()
        elif consumed == "zeroed":
            opt.zero_grad(set_to_none=False)
        loss = model(torch.randn(6, 4)).pow(2).mean()
        if consumed == "by_hand_zeroed_after_forward":
            model.zero_grad()
        loss.backward()
        losses.append(loss.item())
        if consumed == "by_hand_zeroed_after_forward":
            with torch.no_grad():
                for param in model.parameters():
                    param -= 0.01 * param.grad
        elif consumed == "by_hand":
            with torch.no_grad():
                for param in model.parameters():
                    param -= 0.01 * param.grad
            model.zero_grad()
    inst.at_exit()
    logs = inst.fake.logs
    if consumed == "kept":
        assert logs == []
        return
    assert [log["loss"] for log in logs] == pytest.approx(losses)
    assert [log["samples"] for log in logs] == [6, 6, 6, 6]
    # the first from its forward; the others from the backward before, the batch in it
    assert [log["step_time"] for log in logs] == pytest.approx([0.030, 0.035, 0.035, 0.035])
    for log in logs[1:]:
        assert log["phases"]["data"] == pytest.approx(0.005)
        assert log["phases"]["forward"] == pytest.approx(0.010)
        assert log["phases"]["backward"] == pytest.approx(0.020)
        assert log["phases"]["optimizer"] == 0.0


def test_micro_batches_before_the_first_optimizer_step_are_one_step(inst):
    """Gradient accumulation without ``no_sync``: every micro-batch's backward syncs, and
    its gradients stay for the next one until the optimizer steps: the window is one step
    from the very first (no optimizer seen yet), as after it."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        for _ in range(4):
            clock.advance(0.005)
            (model(torch.randn(6, 4)).pow(2).mean() / 4).backward()
        opt.step()
        opt.zero_grad()
    inst.at_exit()
    assert [log["samples"] for log in inst.fake.logs] == [24, 24, 24]


def test_a_plain_optimizer_without_ddp_still_makes_steps(inst):
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    losses = [train_step(model, opt, clock).item() for _ in range(3)]
    inst.flush()
    assert len(inst.fake.logs) == 3
    # no DDP module (FSDP, a plain model): the loss of backward() all the same
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(losses)
    last = inst.fake.logs[-1]
    # no forward seen: the step time, but no made-up split of it (a data+forward+backward
    # lump named "other" misled on pytorch/examples' FSDP2 example)
    assert last["phases"] is None
    assert last["step_time"] == pytest.approx(0.005 + 0.010 + 0.020 + 0.001 + 0.003)


def test_a_loss_sent_through_torch_autograd_backward_is_the_steps(inst):
    """huggingface/picotron's pipeline schedule calls ``torch.autograd.backward(output,
    grad_tensors=grad)``: on its last stage the output is the loss (and no gradient), on the
    others an activation with the gradient the next stage sent. Its last stage's loss read
    ``--`` throughout; an activation's backward is no loss; several roots at once are the
    terms of one objective (summed); ``Tensor.backward``, which calls it, counts once."""
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    expected = []
    for how in ("loss", "activation", "terms", "tensor"):
        clock.advance(0.005)
        out = model(torch.randn(6, 4))
        opt.zero_grad()
        if how == "loss":
            loss = out.pow(2).mean()
            torch.autograd.backward(loss)
            expected.append(loss.item())
        elif how == "activation":
            torch.autograd.backward(out, grad_tensors=torch.ones_like(out))
            expected.append(None)
        elif how == "terms":
            first, second = out.pow(2).mean(), out.abs().mean()
            torch.autograd.backward([first, second])
            expected.append(first.item() + second.item())
        else:
            loss = out.pow(2).mean()
            loss.backward()  # through torch.autograd.backward: one loss, not two
            expected.append(loss.item())
        opt.step()
    inst.flush()
    losses = [log.get("loss") for log in inst.fake.logs]
    assert losses[1] is None
    assert [losses[0], *losses[2:]] == pytest.approx([expected[0], *expected[2:]])


class _TotalOfChunks(torch.autograd.Function):
    """torchtitan's bridge (``_DecoderOutputGradientBackProp``): the chunks' losses are
    summed detached; its backward hands the hidden states the gradient they gathered."""

    @staticmethod
    def forward(ctx, hidden, gathered, total):
        ctx.save_for_backward(gathered)
        return total.detach()

    @staticmethod
    def backward(ctx, grad):
        (gathered,) = ctx.saved_tensors
        return gathered * grad, None, None


def _chunked_loss_step(model, head, opt, batches, chunks):
    """One step of torchtitan's chunked loss over micro-batches: for each, the head's loss on
    each chunk of the hidden states (divided by the step's samples), each chunk's
    ``backward()`` at once (into a detached leaf), then ``backward()`` on their total, which
    carries the gathered gradient on through the model. Returns the totals' sum."""
    opt.zero_grad()
    samples = sum(len(x) for x in batches)
    step_loss = 0.0
    for x in batches:
        hidden = model(x)
        total = torch.zeros(())
        gathered = []
        for part in hidden.detach().chunk(chunks):
            part.requires_grad_(True)
            loss = head(part).pow(2).sum() / samples
            total = total + loss.detach()
            loss.backward()
            gathered.append(part.grad)
        _TotalOfChunks.apply(hidden, torch.cat(gathered), total).backward()
        step_loss += total.item()
    opt.step()
    return step_loss


def test_loading_an_optimizers_state_from_a_checkpoint_is_no_step(inst):
    """torch.distributed.checkpoint's state dicts step a fresh optimizer once, with zero
    gradients and learning rate, to make its state (``set_optimizer_state_dict`` loading a
    checkpoint into it, ``get_optimizer_state_dict`` before its first step): torchtitan
    restarted from its checkpoint read a first step with no loss and no samples, one step
    more than it took."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    clock = inst.fake_clock
    model = Net(clock)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    saved = get_optimizer_state_dict(model, opt)  # the first optimizer step of the process
    assert opt.state  # made, by a step of its own
    set_optimizer_state_dict(model, opt, optim_state_dict=saved)
    losses = [train_step(model, opt, clock).item() for _ in range(3)]
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(losses)
    assert inst.fake.logs[-1]["step_time"] == pytest.approx(0.005 + 0.010 + 0.020 + 0.001)


@pytest.mark.parametrize("fresh", [True, False])
def test_a_fresh_optimizer_stepped_at_a_zero_learning_rate_before_any_backward_is_no_step(
    inst, fresh
):
    """torchtitan's own copy of it (``init_optim_state``): zero gradients, every learning rate
    0, a step. An optimizer with a state already, or a step after a backward (a warmup from a
    learning rate of 0), is a training step."""
    clock = inst.fake_clock
    model = Net(clock)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01))
    if not fresh:
        train_step(model, opt, clock)
    for group in opt.param_groups:
        group["lr"] = torch.tensor(0.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()
    losses = [train_step(model, opt, clock).item() for _ in range(2)]  # warmup: lr 0
    inst.flush()
    logs = inst.fake.logs if fresh else inst.fake.logs[2:]
    assert [log["loss"] for log in logs] == pytest.approx(losses)
    assert len(inst.fake.logs) == (2 if fresh else 4)


@pytest.mark.parametrize("chunks, micro", [(2, 1), (8, 1), (8, 2), (3, 4), (70, 1)])
def test_a_loss_computed_in_chunks_is_their_total(inst, chunks, micro):
    """torchtitan's ``ChunkedLossWrapper``: ``backward()`` on each chunk's loss, then on
    their total, for each micro-batch: the step's loss is the totals' sum (0.87 was read where
    its log said 8.0: the mean of 8 parts and their sum; with 2 micro-batches, 0.90 for
    8.09), folded or not (70 chunks: more than MAX_LOSSES)."""
    clock = inst.fake_clock
    torch.manual_seed(0)
    model = Net(clock)
    head = torch.nn.Linear(1, 3)
    opt = timed_sgd([*model.parameters(), *head.parameters()], clock)
    batches = [torch.randn(70, 4) for _ in range(micro)]
    totals = [_chunked_loss_step(model, head, opt, batches, chunks) for _ in range(3)]
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(totals, rel=1e-5)
    assert model.first.weight.grad is not None and model.first.weight.grad.abs().sum() > 0


def test_losses_of_whose_last_is_not_their_sum_are_averaged():
    """Parts and their total: the total; anything else (two micro-batches, zeros, a last
    that is only near the others' sum): their mean, as before."""
    mean = instrument._loss_mean
    assert mean([0.25, 0.5, 0.75], (1, 1), 3) == 0.75
    assert mean([0.25, 0.5, 0.75, 0.125, 0.25, 0.375], (1, 1), 6) == 1.125  # two micro-batches
    assert mean([0.25, 0.5, 0.75, 0.125, 0.25], (1, 1), 5) == 0.375  # no total last: a mean
    assert mean([0.25, 0.5, 0.75], (1, 2), 3) == 1.5  # the rank's factor still applies
    assert mean([1.5, 1.5], (1, 1), 9) == 1.5  # 8 folded into the first, then their total
    assert mean([0.5, 0.75], (1, 1), 2) == 0.625  # two: a mean (a + b is no total of one)
    assert mean([0.0, 0.0, 0.0], (1, 1), 3) == 0.0
    assert mean([0.25, 0.5, 0.76], (1, 1), 3) == pytest.approx(0.5033333)
    assert mean([0.25, 0.5, 0.75], (3, 1), 3) == 0.75  # divided by 3 each: no matter
    assert mean([0.1, 0.2, 0.3, 0.4], (4, 1), 4) == pytest.approx(1.0)


def test_fsdp_gradients_summed_over_the_ranks_report_each_loss_times_them(inst, monkeypatch):
    """torchtitan sets every FSDP module's gradient divide factor to 1 (summed over the
    ranks, not averaged) and divides each rank's loss by all the ranks' tokens: a rank's loss
    is its share, 4.0 of 8.0 on 2 ranks. The rank reports its loss times the ranks, once
    said as the ``summed_loss`` note; any other factor changes nothing."""

    class FSDPModule:
        def set_gradient_divide_factor(self, factor):
            self.factor = factor

    fsdp = types.ModuleType("fake_fsdp")
    fsdp.fully_shard = lambda module, *, mesh=None: module
    fsdp.FSDPModule = FSDPModule
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    inst._follow_fully_shard(fsdp)
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    try:
        sharded = FSDPModule()
        sharded.set_gradient_divide_factor(2.0)  # FSDP's own: averaged
        first = train_step(model, opt, clock).item()
        sharded.set_gradient_divide_factor(1.0)
        FSDPModule().set_gradient_divide_factor(factor=1)  # another module: said once
        second = train_step(model, opt, clock).item()
        inst.flush()
    finally:
        inst.detach()
    assert sharded.factor == 1.0
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx([first, 2 * second])
    assert inst.fake.notes == [("summed_loss", {"group_size": 2})]


@pytest.mark.parametrize("loader", [True, False])
def test_without_ddp_the_first_step_is_timed_from_its_first_batch_or_not_at_all(inst, loader):
    """No DDP forward marks where the first step begins (FSDP, a plain model: pytorch/examples'
    ImageNet script on CPU wraps nothing). Its time was the optimizer's alone: 12 ms for a
    step of 1.25 s there, and the mean rate over the run counted its samples in those 12 ms.
    Now it runs from the moment its first batch came out of the DataLoader (its wait not in
    it, as a DDP step's from its forward); without a DataLoader its time is not known (None:
    no time, no rate), and the steps after it are timed from the one before, as ever."""
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    batches = iter(_loader([6, 6, 6]))
    for _ in range(3):
        clock.advance(0.005)  # waiting for the batch
        x = next(batches)[0] if loader else torch.randn(6, 4)
        clock.advance(0.002)  # moving it, say
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    inst.flush()
    times = [log["step_time"] for log in inst.fake.logs]
    # forward 10 ms, backward 20 ms, the optimizer 3 ms: 35 ms from the batch; 40 ms a step
    assert times[0] == (pytest.approx(0.035) if loader else None)
    assert times[1:] == pytest.approx([0.040, 0.040])
    assert [log.get("rated", True) for log in inst.fake.logs] == [False, True, True]


def _loader(sizes, workers=0):
    """A DataLoader whose batches are (inputs, targets) of the given sizes."""
    data = [torch.randn(n, 4) for n in sizes]
    return torch.utils.data.DataLoader(
        data, batch_size=None, num_workers=workers, collate_fn=lambda x: (x, x[:, 0])
    )


@pytest.mark.parametrize(
    ("ddp", "cut_short", "gpu"),
    [(True, False, False), (True, True, False), (False, False, False), (True, False, True)],
)
def test_the_time_between_two_epochs_is_no_steps(inst, ddp, cut_short, gpu):
    """timm's ``train.py`` and pytorch/examples' ImageNet script: between two passes over
    the training loader the script evaluates, all-reduces its BatchNorm statistics and rank 0
    writes a checkpoint. All of it went into the next epoch's first step (0.67 s of timm's
    0.15 s steps, most of it as ``data``), and the mean rate over the run with it. Now that
    step starts where its loader's iterator is asked for, its batch's wait in its ``data``:
    an epoch's first step is timed as any other. A pass cut short after two batches (a
    steps-per-epoch cap) is an epoch as well; a new iterator for every step's batch
    (``next(iter(loader))``) is none: the time between those stays the steps'."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock)) if ddp else Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    collective = inst._collective_wrapper(lambda *a, **k: clock.advance(0.007))
    if gpu:  # phases from CUDA events: the epoch's first from one recorded at iter(loader)
        inst.torch = FakeTorch(clock, [True])
        inst._cuda = "cuda:0"
        collective = lambda: clock.advance(0.007)  # noqa: E731 (untimed on a GPU)
    data = [torch.randn(6, 4) for _ in range(3)]

    def collate(x):
        clock.advance(0.004)  # the batch's wait, inside the loader
        return x, x[:, 0]

    train = torch.utils.data.DataLoader(data, batch_size=None, collate_fn=collate)
    for _ in range(2):
        for i, (x, _) in enumerate(train):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if cut_short and i == 1:
                break
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))  # the evaluation: 10 ms
        model.train()
        collective()  # BatchNorm statistics all-reduced: 7 ms
        clock.advance(0.300)  # rank 0's checkpoint
    for _ in range(2):  # each step's batch from a new iterator: no epochs
        x, _ = next(iter(train))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        clock.advance(0.050)  # the script's own work between steps
    inst.flush()
    logs = inst.fake.logs
    per_epoch = 2 if cut_short else 3
    times = [log["step_time"] for log in logs]
    # batch 4 ms, forward 10, backward 20, the optimizer 3: 37 ms, the next epoch's first too
    assert times[1 : 2 * per_epoch] == pytest.approx([0.037] * (2 * per_epoch - 1))
    first = logs[per_epoch]
    if ddp:
        assert first["phases"] == pytest.approx(logs[1]["phases"])
        assert first["phases"]["data"] == pytest.approx(0.004)
    # the first batch drawn with ``next(iter(loader))`` starts a pass too; after it, the
    # script's 50 ms between such steps stay in them
    assert times[2 * per_epoch :] == pytest.approx([0.037, 0.037 + 0.050])


def _slow_loader(clock, sizes, first_s, each_s=0.004):
    """A loader whose first batch waits ``first_s`` (its workers starting), each ``each_s``."""
    waits = [first_s] + [each_s] * (len(sizes) - 1)

    def collate(x):
        clock.advance(waits.pop(0) if waits else each_s)
        return x, x[:, 0]

    data = [torch.randn(n, 4) for n in sizes]
    return torch.utils.data.DataLoader(data, batch_size=None, collate_fn=collate)


def test_a_ddp_module_that_trains_in_eval_mode_is_read_as_training(inst):
    """facebookresearch/moco's ``main_lincls.py`` trains a linear probe on a frozen
    backbone: ``model.eval()`` before its loop (BatchNorm must keep its statistics), grad on,
    and validates under ``no_grad``. Every forward read as an evaluation: `samples not
    counted`, no phases, no epoch length, and each epoch's first step held the validation and
    rank 0's checkpoint (20.97 s where the script timed 6.64). A backward through a DDP module's
    eval-mode forward says it trains: its forwards train from then on, the first one's batch
    included."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    model.eval()
    for _ in range(2):
        for x, _ in _slow_loader(clock, [6, 6, 6], first_s=0.500):  # its workers start
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():  # the validation: its loader's start and two forwards
            for x, _ in _slow_loader(clock, [8, 8], first_s=0.300):
                model(x)
        clock.advance(0.200)  # rank 0's checkpoint
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [6] * 6
    assert [log["epoch"] for log in logs] == [0, 0, 0, 1, 1, 1]
    assert inst.fake.notes == [("loader_steps", {"steps": 3})]  # from its first pass
    times = [log["step_time"] for log in logs]
    # batch 4 ms, forward 10, backward 20, the optimizer 3: 37 ms; the epoch's first step
    # its batch's 500 ms wait and no more (not the validation, not the checkpoint)
    assert times[1:3] == pytest.approx([0.037, 0.037])
    assert times[3] == pytest.approx(0.533)
    assert logs[4]["phases"]["forward"] == pytest.approx(0.010)
    assert logs[4]["phases"]["eval"] == 0.0


def test_an_evaluation_in_eval_mode_with_grad_on_stays_one(inst):
    """The reverse: a script that evaluates after ``model.eval()`` without ``no_grad`` and
    trains in ``train()`` mode; its model does not train in eval mode, however many
    backward passes come after its evaluations."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    for _ in range(3):
        train_step(model, opt, clock)
        model.eval()
        for x, _ in _slow_loader(clock, [50], first_s=0.100):
            model(x)  # 10 ms
        model.train()
    inst.flush()
    logs = inst.fake.logs
    assert inst._eval_trainers == set()
    assert [log["samples"] for log in logs] == [6, 6, 6]
    for log in logs[1:]:  # the evaluation's loader (100 ms) and forward (10 ms): its own
        assert log["phases"]["eval"] == pytest.approx(0.110)
        assert log["phases"]["data"] == pytest.approx(0.005)


def test_an_evaluation_begins_with_the_wait_for_its_first_batch(inst):
    """A validation loader's workers take seconds to start (5.9 s of moco's): that wait was
    the next training step's, as ``other``."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    model.eval()
    with torch.no_grad():
        for x, _ in _slow_loader(clock, [8, 8], first_s=0.400):
            model(x)
    model.train()
    train_step(model, opt, clock)
    inst.flush()
    second = inst.fake.logs[1]["phases"]
    assert second["eval"] == pytest.approx(0.400 + 0.010 + 0.004 + 0.010)
    assert second["other"] == pytest.approx(0.001)  # its clipping, no more
    assert second["data"] == pytest.approx(0.005)


def test_an_evaluations_loader_closing_is_the_evaluations_not_the_next_steps(inst):
    """rasbt/LLMs-from-scratch's DDP script evaluates every 5 steps on one batch of its
    training loader and one of its validation loader, each with 4 workers, and ``break``s:
    each loader's workers shut down after the evaluation's last forward, and that was the
    next step's ``other`` (1.44 s of a 4.0 s step, 0.4-0.7 s of 2 s ones), and so was the
    making of each loader's iterator, which forks its workers. A pass run to its end shuts
    them down inside its last ``next()``. All of it is the evaluation's now; with no
    evaluation open (a training loader's end), a shutdown changes nothing."""
    from torch.utils.data import dataloader

    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)

    class Closing(torch.utils.data.Sampler):  # its end takes the workers' shutdown
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            yield from range(self.n)
            clock.advance(0.300)

        def __len__(self):
            return self.n

    class Workers:  # a multi-worker iterator already shut down: the wrapper's own timing
        _shutdown = True

    class Starting(torch.utils.data.DataLoader):  # its iterator forks its workers
        def _get_iterator(self):
            clock.advance(0.200)
            return super()._get_iterator()

    data = [torch.randn(8, 4)] * 2
    for left in ("ran out", "left"):
        train_step(model, opt, clock)
        model.eval()
        with torch.no_grad():
            loader = Starting(data, batch_size=None, sampler=Closing(2), collate_fn=lambda x: x)
            for i, x in enumerate(loader):
                if left == "left" and i == 1:
                    break
                model(x)  # 10 ms each
            if left == "left":
                clock.advance(0.250)  # the pass left: its iterator's workers shut down
                dataloader._MultiProcessingDataLoaderIter._shutdown_workers(Workers())
        model.train()
    train_step(model, opt, clock)
    inst.flush()
    ran_out, left = (log["phases"] for log in inst.fake.logs[1:3])
    assert ran_out["eval"] == pytest.approx(0.200 + 0.010 + 0.010 + 0.300)
    assert left["eval"] == pytest.approx(0.200 + 0.010 + 0.250)
    for phases in (ran_out, left):
        assert phases["other"] == pytest.approx(0.001)  # its clipping, no more
    # with no evaluation open (the training's loaders), a shutdown changes nothing
    assert inst._eval_start is None and inst._eval_end is None
    dataloader._MultiProcessingDataLoaderIter._shutdown_workers(Workers())
    assert inst._eval_start is None and inst._eval_end is None


def test_an_evaluation_of_a_model_no_ddp_module_wraps_is_out_of_the_next_step(inst):
    """YOLOv5's ``train.py`` validates its EMA copy (no DDP module) under inference mode, on
    rank 0 only: no evaluation forward is seen, and its 81 s were the next step's (the run's
    rate 0.76 samples/s where its steps made 27). Its batches drawn with grad off say it: from
    the first draw's wait to the last draw's end, ``eval``, or to the pass's end where it ran
    out (the loop's last ``next()``, after the last batch's forward); the metrics after it stay
    the step's, and so does the last batch's forward of a pass left before its end."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    ema = Net(clock)  # a copy, not wrapped
    for ran_out in (True, False):
        train_step(model, opt, clock)
        with torch.inference_mode():
            for i, (x, _) in enumerate(_slow_loader(clock, [8, 8, 8], first_s=0.400)):
                ema(x)  # 0.010 each
                if i == 2 and not ran_out:
                    break
        clock.advance(0.050)  # its metrics, its checkpoint
    train_step(model, opt, clock)
    inst.flush()
    for log, ran_out in zip(inst.fake.logs[1:3], (True, False), strict=True):
        last = 0.010 if ran_out else 0.0  # the last batch's forward: the pass's, if it ran out
        assert log["phases"]["eval"] == pytest.approx(0.400 + 0.010 + 0.004 + 0.010 + 0.004 + last)
        # the metrics and the next batch's wait: the step's, as before
        assert log["phases"]["data"] == pytest.approx(0.010 - last + 0.050 + 0.005)
        trained = sum(log["phases"][p] for p in PHASES if p != "eval")
        assert log["step_time"] == pytest.approx(trained)


def test_one_batch_drawn_with_grad_off_before_a_training_forward_is_no_evaluation(inst):
    """A training loop that draws its batch under ``no_grad`` (one a step): its wait is the
    step's ``data``, as it was."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    loader = iter(_slow_loader(clock, [6, 6, 6], first_s=0.200, each_s=0.030))
    for _ in range(3):
        with torch.no_grad():
            x, _ = next(loader)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        clock.advance(0.001)
        opt.step()
    inst.flush()
    for log in inst.fake.logs[1:]:
        assert log["phases"]["eval"] == 0.0
        assert log["phases"]["data"] == pytest.approx(0.030)


class _Iterator:
    """What the restart rule reads of a DataLoader iterator."""

    def __init__(self, workers, persistent):
        self._num_workers, self._persistent_workers = workers, persistent


@pytest.mark.parametrize(
    ("workers", "persistent", "pass_s", "wait_s", "noted"),
    [
        (2, False, 5.0, 26.0, True),  # ijepa: 8 steps of 0.6 s, 26 s for its workers
        (2, True, 5.0, 26.0, False),  # persistent workers: started once, not this pass
        (0, False, 5.0, 26.0, False),  # no workers: the wait is the loading itself
        (2, False, 600.0, 26.0, False),  # a long pass: 26 s is little of it
        (2, False, 5.0, 4.0, False),  # a short wait
    ],
)
def test_a_pass_that_waits_long_for_its_loaders_workers_to_start_again_is_noted_once(
    inst, workers, persistent, pass_s, wait_s, noted
):
    clock = inst.fake_clock
    it = _Iterator(workers, persistent)
    inst._iter_at = clock()
    inst._check_restart(it, clock())  # the first pass: its workers start anyway
    for passes in (1, 2, 3):
        inst._passes = passes
        clock.advance(pass_s)
        inst._iter_at = clock()
        clock.advance(wait_s)
        inst._check_restart(it, clock())
    expected = [("loader_restart", {"workers": 2, "seconds": round(wait_s), "passes": 2})]
    assert inst.fake.notes == (expected if noted else [])


def test_a_real_loaders_restart_is_seen_at_its_second_pass(inst, monkeypatch):
    """The rule's thresholds aside: a real DataLoader's iterator says its workers and
    whether they persist, and the note goes out at a training pass's first batch."""
    monkeypatch.setattr(instrument, "LOADER_RESTART_S", 0.0)
    monkeypatch.setattr(instrument, "LOADER_RESTART_SHARE", 0.0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for persistent in (True, False):
        inst.fake.notes.clear()
        data = [torch.randn(4, 4) for _ in range(2)]
        loader = torch.utils.data.DataLoader(
            data, batch_size=None, num_workers=1, persistent_workers=persistent
        )
        for _ in range(2):
            for x in loader:
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        codes = [code for code, _ in inst.fake.notes if code == "loader_restart"]
        assert codes == ([] if persistent else ["loader_restart"])
        inst._restart_noted = False


class Predictor(torch.nn.Module):
    """A module fed another's output (ijepa's predictor, its context encoder's)."""

    def __init__(self, clock, forward_s):
        super().__init__()
        self.clock, self.forward_s = clock, forward_s
        self.layer = torch.nn.Linear(1, 1)

    def forward(self, z):
        return Tick.apply(self.layer(z), self.clock, self.forward_s, 0.0)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "static_graph"])
def test_a_target_networks_forward_with_grad_off_is_the_steps_not_an_evaluation(inst, wrapped):
    """facebookresearch/ijepa's step: its batch drawn (images and masks, nested as no other
    loader's are), its target encoder (a DDP module in training mode) run on it under
    ``no_grad``, then its context encoder, and its predictor on the encoder's output, train.
    The target's forward read as an evaluation (out of the step: a third of its time), and
    the predictor's input as 16 more samples (each step of 16 read 32). ijepa's encoder has
    ``static_graph=True``: DDP returns other tensors than its module's then."""
    clock = inst.fake_clock
    target = DistributedDataParallel(Net(clock, forward_s=0.006))
    encoder = DistributedDataParallel(Net(clock), static_graph=wrapped)
    predictor = DistributedDataParallel(Predictor(clock, forward_s=0.004))
    opt = timed_sgd([*encoder.parameters(), *predictor.parameters()], clock)
    waits = [0.200, 0.030, 0.030]

    def collate(x):  # ijepa's collator: ((images, labels), masks)
        clock.advance(waits.pop(0))
        return (x, x[:, 0]), [x[:, :1]]

    data = [torch.randn(6, 4) for _ in range(3)]
    loader = torch.utils.data.DataLoader(data, batch_size=None, collate_fn=collate)
    for (x, _), _masks in loader:
        with torch.no_grad():
            h = target(x)
        z = predictor(encoder(x))
        loss = (z - h).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        clock.advance(0.001)
        opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [6, 6, 6]
    for log in inst.fake.logs[1:]:
        phases = log["phases"]
        assert phases["eval"] == 0.0
        assert phases["data"] == pytest.approx(0.030)
        assert phases["forward"] == pytest.approx(0.006 + 0.010 + 0.004)
        assert log["step_time"] == pytest.approx(sum(phases.values()))


def test_a_ddp_module_fed_a_plain_modules_output_counts_its_samples(inst):
    """pytorch/examples' ``ddp_rpc``: the DDP module takes the lookups of an embedding held
    elsewhere (over RPC), a tensor with a ``grad_fn``: its only count of the step's samples
    (a rule that left out any input with a ``grad_fn`` read "samples not counted")."""
    clock = inst.fake_clock
    embedding = torch.nn.Linear(4, 4)  # no DDP module: the remote embedding's place
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd([*embedding.parameters(), *model.parameters()], clock)
    for _ in range(2):
        loss = model(embedding(torch.randn(6, 4))).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [6, 6]


def test_an_evaluation_with_grad_off_after_a_step_stays_one(inst):
    """The same forward of a module in training mode with grad off, once the step has
    ended and before the next one draws: an evaluation (a script that validates without
    ``model.eval()``), as it was."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    for x, _ in _slow_loader(clock, [6, 6], first_s=0.200, each_s=0.030):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            model(torch.randn(4, 4))  # 0.010
    inst.flush()
    assert inst.fake.logs[1]["phases"]["eval"] == pytest.approx(0.010)


class Detector(torch.nn.Module):
    """torchvision's detection models' way of being called: a list of images, each
    ``[C, H, W]`` of its own size, and in training a list of target dicts."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3, 1)

    def forward(self, images, targets=None):
        if isinstance(images, NestedImages):  # DETR's: padded to one size, with a mask
            images = list(images.tensors)
        pooled = torch.stack([image.mean(dim=(1, 2)) for image in images])
        return self.head(pooled).pow(2).mean()


class NestedImages:
    """DETR's ``NestedTensor``: images padded into one tensor, and their masks."""

    def __init__(self, tensors, mask):
        self.tensors, self.mask = tensors, mask


def _detection_data(count):
    """Images of their own sizes with a target dict each, as a COCO detection dataset's."""
    sizes = [(20 + i % 3, 24 + i % 5) for i in range(count)]
    return [
        (torch.rand(3, h, w), {"boxes": torch.tensor([[1.0, 1.0, 8.0, 9.0]]), "labels": 1})
        for h, w in sizes
    ]


def _nested(batch):
    images, targets = zip(*batch, strict=True)
    h, w = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    padded = torch.zeros(len(images), 3, h, w)
    for n, image in enumerate(images):
        padded[n, :, : image.shape[1], : image.shape[2]] = image
    return NestedImages(padded, torch.zeros(len(images), h, w, dtype=torch.bool)), targets


@pytest.mark.parametrize("kind", ["torchvision", "detr", "records"])
def test_a_detection_steps_samples_are_its_images_not_their_channels(inst, kind):
    """torchvision's detection references train ``model(images, targets)``: lists of images
    ``[3, H, W]`` and of target dicts, drawn as tuples (``collate_fn``: ``tuple(zip(*batch))``);
    a step counted 3 samples, the first image's channels, whatever its batch. DETR's model
    takes a ``NestedTensor`` (no tensor to count: it counted 0 samples) and its loader gives it
    with a tuple of target dicts. A loader that hands its samples' dicts as they are
    (``collate_fn=lambda b: b``) is as many samples as dicts. 10 images, 4 a batch: 4, 4, 2."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Detector())
    opt = timed_sgd(model.parameters(), clock)
    data = _detection_data(10)
    if kind == "records":
        data = [{"image": image, "target": target} for image, target in data]
        collate = list
    else:
        collate = _nested if kind == "detr" else (lambda batch: tuple(zip(*batch, strict=True)))
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=collate)
    for _ in range(2):  # the epoch again: its first step is no rate
        for batch in loader:
            if kind == "records":
                images = torch.stack([r["image"][:, :20, :24] for r in batch])
                loss = model(list(images), [r["target"] for r in batch])
            elif kind == "detr":
                loss = model(batch[0])
            else:
                loss = model(list(batch[0]), list(batch[1]))
            opt.zero_grad()
            loss.backward()
            clock.advance(0.010)
            opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [4, 4, 2] * 2


class GraphBatch:
    """PyTorch Geometric's ``Batch`` as far as counting goes: every node's features in one
    tensor, and how many graphs (its ``batch_size``, also its ``num_graphs``)."""

    def __init__(self, graphs, told=None):
        self.x = torch.cat(graphs)
        self.batch_size = len(graphs) if told is None else told


@pytest.mark.parametrize(
    ("told", "expected"),
    [(None, [4, 4, 2]), (True, [23, 24, 12]), ("4", [23, 24, 12]), (-4, [23, 24, 12]),
     (10**12, [23, 24, 12])],
)  # fmt: skip
def test_a_graph_batchs_samples_are_its_graphs_not_their_nodes(inst, told, expected):
    """PyTorch Geometric's loader gives a ``Batch`` of graphs, and the model's first tensor
    holds every node of them (``model(data.x, data.edge_index, data.batch)``): 64 graphs of
    about 30 nodes, 2 epochs, counted 3,794 samples where there were 128 graphs. A batch
    object of its own that says its ``batch_size`` is that many samples; one that says no
    whole number in bounds leaves the forward's count (the nodes)."""
    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    opt = timed_sgd(model.parameters(), clock)
    graphs = [torch.rand(5 + i % 3, 3) for i in range(10)]  # nodes a batch: 23, 24, 12
    loader = torch.utils.data.DataLoader(
        graphs, batch_size=4, collate_fn=lambda batch: GraphBatch(batch, told)
    )
    for data in loader:
        loss = model(data.x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        clock.advance(0.010)
        opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == expected


def test_without_ddp_the_samples_are_the_data_loaders_batches(inst):
    """FSDP, a plain model (pytorch/examples' imagenet script on CPU wraps nothing): no DDP
    forward counts the samples, the DataLoader's batches do; gradient accumulation sums
    them, an evaluation loader's batches in between are not the step's (under no_grad, or
    before the next training batch)."""
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    evaluation = _loader([7, 7])
    batches = iter(_loader([4, 5, 3, 6, 2]))
    for accumulate in (1, 2, 1):
        opt.zero_grad()
        for _ in range(accumulate):
            x, _ = next(batches)
            model(x).pow(2).mean().backward()
        if accumulate == 2:
            with torch.no_grad():
                for x, _ in evaluation:
                    model(x)
        opt.step()
    model.eval()
    for x, _ in _loader([9]):  # an evaluation with grad enabled, after the step
        model(x)
    model.train()
    x, _ = next(batches)
    model(x).pow(2).mean().backward()
    opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [4, 5 + 3, 6, 2]
    # the first step, timed from its first forward, is no rate; the others are
    assert [log.get("rated", True) for log in inst.fake.logs] == [False, True, True, True]


@pytest.mark.parametrize(
    ("workers", "ddp", "evaluate"),
    [(0, False, "no_grad"), (1, False, "no_grad"), (0, True, "no_grad"), (0, True, "eval mode")],
)
def test_without_a_sampler_the_epoch_is_the_training_passes(inst, workers, ddp, evaluate):
    """timm's ``train.py`` on one device: no DDP module, no DistributedSampler, and the
    dashboard showed epoch ``-`` for the whole run (so did DDP ranks that shard their data
    themselves). The epoch is the passes over the loader that feeds training, from 0: not a
    peek at one batch before training, not an evaluation loader's passes (under no_grad, or
    with grad enabled after ``model.eval()``: the DDP module in eval mode), not a pass cut
    short after one batch; a pass cut short after more does count (a script's
    steps-per-epoch cap)."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock)) if ddp else Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    train, evaluation = _loader([4, 4, 4], workers), _loader([7, 7])

    def step(x):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    x, _ = next(iter(train))  # the script looks at a batch's shape first
    for _ in range(2):
        for x, _ in train:
            step(x)
        if evaluate == "no_grad":
            with torch.no_grad():
                for x, _ in evaluation:
                    model(x)
        else:
            model.eval()
            for x, _ in evaluation:
                model(x)
            model.train()
    for i, (x, _) in enumerate(train):  # a third epoch, cut short after two steps
        step(x)
        if i == 1:
            break
    for x, _ in train:  # a fourth
        step(x)
        break
    inst.flush()
    assert [log["epoch"] for log in inst.fake.logs] == [0, 0, 0, 1, 1, 1, 2, 2, 3]


def test_a_batch_drawn_with_a_new_iterator_each_step_is_no_epoch(inst):
    """``x, y = next(iter(loader))`` each step starts a pass every step: those are no
    epochs. A DistributedSampler told its epoch is the script's word, whatever the passes."""
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    loader = _loader([4, 4, 4])
    for _ in range(3):
        x, _ = next(iter(loader))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(5)
    for x, _ in loader:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    inst.flush()
    assert [log["epoch"] for log in inst.fake.logs] == [0, 0, 0, 5, 5, 5]


def test_an_iterator_that_takes_a_dead_passs_address_is_not_that_pass(inst):
    """The passes are told apart by their iterators, and CPython gives a new object the
    address of one just freed: a step's batch drawn with ``next(iter(loader))`` leaves its
    iterator to die at once, and an evaluation's iterator made next may take its address
    (here until one has, and a step has come after it), so the end of the evaluation's pass
    was read as that training pass's end, and the next step's pass counted as an epoch:
    epoch 1 from then on, for steps that make none. The evaluation's end was lost with it."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    loader, evaluation = _loader([4, 4, 4]), _loader([7, 7])
    reused, steps = False, 0
    while steps < 100:
        steps += 1
        it = iter(loader)
        x, _ = next(it)
        dead, it = id(it), None  # as ``next(iter(loader))`` leaves it
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if reused:  # a step after it
            break
        with torch.no_grad():
            passing = iter(evaluation)
            reused = id(passing) == dead
            for x, _ in passing:
                model(x)
            passing = None
    inst.flush()
    assert reused, "no iterator took a dead one's address: the case is not made"
    assert [log["epoch"] for log in inst.fake.logs] == [0] * steps


def test_with_ddp_the_forwards_count_the_samples_up_to_the_batches_drawn(inst):
    """A contrastive script (SimCLR's two views of each batch) or a GAN runs its DDP module
    more than once a batch: the batch counts once. A batch drawn ahead of its step (a fetcher
    that prefetches the next) is not the step's; a step that feeds part of its batch counts that
    part, and one that drew none (the script makes its batches) its forwards."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    for x, _ in _loader([4, 5]):
        opt.zero_grad()
        (model(x) - model(x.flip(0))).pow(2).mean().backward()  # two views, one batch
        opt.step()
    batches = iter(_loader([6, 7, 8]))
    x, ahead = next(batches)[0], next(batches)[0]  # the next batch drawn ahead
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        x, ahead = ahead, next(batches, (ahead,))[0]
    for x, _ in _loader([4]):
        opt.zero_grad()
        model(x[:2]).pow(2).mean().backward()  # the script feeds part of the batch
        opt.step()
    opt.zero_grad()
    model(torch.randn(3, 4)).pow(2).mean().backward()
    opt.step()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [4, 5, 6, 7, 2, 3]


@pytest.mark.parametrize("closure", [False, True])
def test_data_is_the_wait_for_the_loaders_batch_and_the_work_before_the_forward_is_other(
    inst, closure
):
    """A step whose batch comes from a DataLoader: its ``data`` is the wait there, as the
    scripts' own "Data" times are; the work between the batch and the forward (Lightning's
    hooks before each step, a framework's or the script's own bookkeeping) is ``other``.
    Lightning's ``backbone_image_classifier.py`` showed 37 % data and 0 % other, where 25 %
    was its wait in the loader and 10 % its hooks. A step that makes its own batch (no
    DataLoader) keeps it all as ``data``, as before."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    data = [torch.randn(6, 4) for _ in range(3)]

    def collate(x):
        clock.advance(0.002)  # the batch's wait, inside the loader
        return x, x[:, 0]

    def train(x):
        clock.advance(0.005)  # the framework's hooks before the step
        if closure:  # Lightning's way: forward and backward inside optimizer.step

            def step():
                opt.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                return loss

            opt.step(step)
        else:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    for x, _ in torch.utils.data.DataLoader(data, batch_size=None, collate_fn=collate):
        train(x)
    clock.advance(0.007)  # a batch the script makes itself
    train(torch.randn(6, 4))
    inst.flush()
    second, third = inst.fake.logs[1]["phases"], inst.fake.logs[3]["phases"]
    assert second["data"] == pytest.approx(0.002)
    # with a closure, the optimizer's 3 ms before it calls the closure (its pre-step hook
    # here, the framework's prelude in Lightning) is other too; it was data before
    assert second["other"] == pytest.approx(0.005 + (0.003 if closure else 0.0))
    assert third["data"] == pytest.approx(0.007 + 0.005 + (0.003 if closure else 0.0))
    assert sum(second.values()) == pytest.approx(inst.fake.logs[1]["step_time"])


def test_ddps_own_warnings_name_the_scripts_line(inst):
    """DDP's constructor warns at its caller (``stacklevel=2``), which under ddptui was its
    wrapper: timm's log read ``ddptui/rank/instrument.py:763: FutureWarning:
    `broadcast_buffers` is deprecated`` where plain torchrun named timm's own line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        DistributedDataParallel(torch.nn.Linear(2, 2), broadcast_buffers=True)
    mine = [w for w in caught if "broadcast_buffers" in str(w.message)]
    if not mine:
        pytest.skip("this torch does not deprecate broadcast_buffers")
    assert {(w.filename, w.lineno) for w in mine} == {(__file__, line)}


def test_a_warning_at_the_wrappers_caller_goes_to_the_scripts_line_and_filters():
    """Any warning a wrapped call points at its caller is the script's, its filters with it
    (one that names the script's module ignores it); one pointing elsewhere keeps its place."""

    def deprecated():  # torch's way: the warning names the line that called it
        warnings.warn("this argument is deprecated", FutureWarning, stacklevel=2)
        warnings.warn("inside torch", UserWarning, stacklevel=1)

    script = sys._getframe()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        instrument.warned_at_script(script, functools.partial(deprecated))
    assert [(w.category, w.filename, w.lineno) for w in caught] == [
        (FutureWarning, __file__, line),
        (UserWarning, __file__, deprecated.__code__.co_firstlineno + 2),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=FutureWarning, module=__name__)
        instrument.warned_at_script(script, functools.partial(deprecated))
    assert [w.category for w in caught] == [UserWarning]


def test_a_batch_drawn_ahead_counts_in_the_step_that_takes_it(inst):
    """timm's ``train.py`` with ``--grad-accum-steps 2`` under its prefetcher (its default on
    a GPU): each step draws the batch after its own, so the epoch's last step draws only one
    of its two micro-batches. It counted 4 samples of 8 (176 samples where the run trained
    192); the batch drawn ahead is now counted in the step that takes it."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)

    def prefetched(loader):  # timm's PrefetchLoader: the next batch drawn before this one goes
        batches = iter(loader)
        ahead = next(batches, None)
        while ahead is not None:
            current, ahead = ahead, next(batches, None)
            yield current

    for _ in range(2):  # two epochs of three steps, each of two micro-batches of 4
        for i, (x, _) in enumerate(prefetched(_loader([4] * 6))):
            model(x).pow(2).mean().div(2).backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [8] * 6


def test_a_batch_drawn_ahead_in_the_last_pass_counts_in_the_step_that_takes_it(inst):
    """HF accelerate's ``DataLoaderShard`` draws one batch ahead, and a script that cycles
    over it (lucidrains/denoising-diffusion-pytorch's ``Trainer``: two micro-batches a step,
    a pass of 13 batches) starts a new pass of the same loader inside a step. Counted afresh,
    the new pass lost the batch drawn ahead in the last one: 8 samples for a step of 16, 464
    of 480."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    loader = _loader([4] * 5)
    passes = []  # each pass's iterator kept: another pass's is never at the same address

    def shard():  # accelerate's: the next batch drawn before this one goes
        batches = iter(loader)
        passes.append(batches)
        current = next(batches)
        for ahead in batches:
            yield current
            current = ahead
        yield current

    def cycle():
        while True:
            yield from shard()

    batches = cycle()
    for _ in range(10):  # four passes of five batches, two micro-batches a step
        for _ in range(2):
            x, _ = next(batches)
            model(x).pow(2).mean().div(2).backward()
        opt.step()
        opt.zero_grad()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [8] * 10


@pytest.mark.parametrize("ddp", [False, True])
def test_a_gan_iteration_is_one_step_with_the_discriminators_loss(inst, ddp):
    """DCGAN (pytorch/examples): each batch steps the discriminator's optimizer, then the
    generator's. ddptui showed two steps an iteration, every other one with no samples, and
    the loss zigzagging between the mean of the discriminator's two losses and the
    generator's. An iteration is one step: its samples the batch, its loss the script's
    ``Loss_D`` (``errD_real + errD_fake``: two terms of one batch's objective), its time the
    whole iteration's. One optimizer stepping again on a batch drawn once (overfitting one
    batch) still ends a step each time."""
    clock = inst.fake_clock
    wrap = DistributedDataParallel if ddp else (lambda module: module)
    netD = wrap(Net(clock))
    netG = wrap(torch.nn.Linear(4, 4))
    optD, optG = timed_sgd(netD.parameters(), clock), timed_sgd(netG.parameters(), clock)
    loss_d = []
    for x, _ in _loader([4, 5, 3]):
        clock.advance(0.004)
        optD.zero_grad()
        err_real = netD(x).pow(2).mean()
        err_real.backward()
        fake = netG(torch.randn(len(x), 4))
        err_fake = (netD(fake.detach()) - 1).pow(2).mean()
        err_fake.backward()
        optD.step()
        loss_d.append((err_real + err_fake).item())
        optG.zero_grad()
        netD(fake).pow(2).mean().backward()
        clock.advance(0.002)
        optG.step()
    iteration = 0.004 + 3 * 0.010 + 3 * 0.020 + 0.003 + 0.002 + 0.003  # data, D, G: fake time
    x, _ = next(iter(_loader([6])))
    for _ in range(2):  # one optimizer, one batch drawn once: a step each time
        optD.zero_grad()
        netD(x).pow(2).mean().backward()
        optD.step()
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 5
    assert [log["loss"] for log in logs[:3]] == pytest.approx(loss_d)
    assert [log["samples"] for log in logs] == [4, 5, 3, 6, 0 if not ddp else 6]
    # The first step starts at its first forward; the others span a whole iteration.
    assert [log["step_time"] for log in logs[1:3]] == pytest.approx([iteration] * 2)


@pytest.mark.parametrize("ddp", [False, True])
def test_an_optimizer_stepping_twice_on_an_iterations_batch_is_one_step(inst, ddp):
    """NVlabs/stylegan3's training loop draws one batch an iteration from an endless loader
    and runs its phases on it: the generator's main step, its regularization every fourth
    iteration with the same optimizer, the discriminator's main step, and its regularization
    every sixteenth, again with its optimizer. ddptui counted 50 steps a rank for 32
    iterations: each regularization step of an optimizer that had stepped already on the
    batch ended a step with no samples, and the discriminator's after it another. Once the
    script has drawn a batch for each of two steps, an iteration is one step whatever its
    optimizers do on its batch, its loss the first optimizer's. The first iteration, with no
    such history, stays four steps (with DDP each counts its forward's samples, as a step
    that drew no batch does)."""
    clock = inst.fake_clock
    wrap = DistributedDataParallel if ddp else (lambda module: module)
    netG, netD = wrap(Net(clock)), wrap(Net(clock))
    optG, optD = timed_sgd(netG.parameters(), clock), timed_sgd(netD.parameters(), clock)

    def endless(loader):  # stylegan3's InfiniteSampler: one pass that never ends
        while True:
            yield from loader

    batches = endless(_loader([4] * 20))
    losses = []
    for i in range(8):
        x, _ = next(batches)
        phases = [(optG, netG, 1), (optG, netG, 2), (optD, netD, 1), (optD, netD, 4)]
        for n, (opt, net, interval) in enumerate(phases):
            if i % interval:
                continue
            opt.zero_grad()
            loss = net(x + n).pow(2).mean()
            loss.backward()
            opt.step()
            if n == 0:
                losses.append(loss.item())
    x, _ = next(iter(_loader([6])))  # a batch drawn once and overfitted: a step each time
    for _ in range(2):
        optD.zero_grad()
        netD(x).pow(2).mean().backward()
        optD.step()
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 4 + 7 + 2
    assert [log["samples"] for log in logs[4:]] == [4] * 7 + [6, 0 if not ddp else 6]
    assert [log["loss"] for log in logs[4:11]] == pytest.approx(losses[1:])


@pytest.mark.parametrize("fresh", [False, True], ids=["kept", "made each step"])
@pytest.mark.parametrize("ddp", [False, True])
def test_without_a_data_loader_a_second_optimizer_after_the_step_joins_its_iteration(
    inst, ddp, fresh
):
    """Batches sliced from tensors, no DataLoader to tell iterations apart: a second
    optimizer stepping after the one that ended the step is in its iteration (udit4code's
    manual data-parallel SGD: rank 0 steps a single-process reference model after each
    step, and counted 20 steps to rank 1's 10, every other one with the reference's loss;
    a GAN on made-up data). The step's loss is the first optimizer's. An optimizer made
    anew each step over the same parameters is the same one: each of its steps is a step."""
    clock = inst.fake_clock
    wrap = DistributedDataParallel if ddp else (lambda module: module)
    model, reference = wrap(Net(clock)), Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    losses = []
    for _ in range(4):
        clock.advance(0.004)
        if fresh:
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
        opt.zero_grad()
        loss = model(torch.randn(4, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        reference.zero_grad()
        (reference(torch.randn(8, 4)) - 1).pow(2).mean().backward()
        torch.optim.SGD(reference.parameters(), lr=0.01).step()  # a new one each time
    inst.at_exit()
    logs = inst.fake.logs
    assert [log["loss"] for log in logs] == pytest.approx(losses)


def _models_one_after_another(clock, wrap, models, steps):
    """Train ``models`` models (``wrap(Net)``) of ``steps`` steps each on batches made up,
    one after another, each let go before the next is made; weak references to each one's
    parameters."""
    params = []
    for _ in range(models):
        model = wrap(Net(clock))
        params.append([weakref.ref(p) for p in model.parameters()])
        opt = timed_sgd(model.parameters(), clock)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 4)).pow(2).mean().backward()
            opt.step()
        model = opt = None
        gc.collect()  # (what a model's reference cycles wait for: DDP's)
    return params


@pytest.mark.parametrize("ddp", [False, True])
def test_without_a_data_loader_a_model_and_optimizer_made_anew_step_on_their_own(inst, ddp):
    """A script that trains one model, then another in its place (a next stage, or the
    next configuration it compares, each on made-up data: no DataLoader): the new
    optimizer is no second optimizer of the last step's iteration, the old one being gone.
    Each new model's first step joined the last model's step and was lost: 13 steps of 18,
    five of them of twice a step's time, with one batch's samples. Without DDP, the samples
    are the forwards of the module each optimizer trains, counted from its second step (as
    the first model's)."""
    wrap = DistributedDataParallel if ddp else (lambda module: module)
    _models_one_after_another(inst.fake_clock, wrap, models=6, steps=3)
    inst.at_exit()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [4] * 18 if ddp else [0, 4, 4] * 6
    times = [log["step_time"] for log in logs]
    assert times[1:] == pytest.approx([0.033] * 17)
    assert times[0] == (pytest.approx(0.033) if ddp else None)  # (no beginning seen)


def test_a_ddp_module_let_go_of_within_a_step_leaves_the_steps_counted(inst):
    """The DDP module goes between its forward and the backward (the script keeps its inner
    module and trains that on): the watch has let go of its parameters, whose hooks still
    fire. Reading a gradient from the released watch raised IndexError, and the
    instrumentation turned itself off: no step at all."""
    clock = inst.fake_clock
    net = Net(clock)
    model = DistributedDataParallel(net)
    loss = model(torch.randn(4, 4)).pow(2).mean()
    model = None
    gc.collect()
    loss.backward()
    opt = timed_sgd(net.parameters(), clock)
    opt.step()
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(4, 4)).pow(2).mean().backward()
        opt.step()
    inst.at_exit()
    assert not inst.disabled
    assert [log["samples"] for log in inst.fake.logs] == [4, 4, 4]


def test_without_ddp_or_a_data_loader_an_optimizer_made_each_step_counts_each_batch_once(inst):
    """A plain model, batches it makes itself, an optimizer made anew each step (the last
    one gone each time): the module it trains is watched once, each step's batch counted
    once, whichever optimizer steps it."""
    clock = inst.fake_clock
    model = Net(clock)
    for _ in range(5):
        opt = timed_sgd(model.parameters(), clock)
        opt.zero_grad()
        model(torch.randn(4, 4)).pow(2).mean().backward()
        opt.step()
        opt = None
    inst.at_exit()
    assert [log["samples"] for log in inst.fake.logs] == [0, 4, 4, 4, 4]


def test_a_model_the_script_lets_go_of_goes_with_its_parameters(inst):
    """A script that trains one DDP model after another (a fold after a fold, a stage
    after a stage) lets each go: its parameters, a GPU's memory, go with it, as without
    ddptui. The gradient watch kept every DDP module's parameters to the end of the run,
    and the parameter the first backward's gradient was read from stayed too."""
    params = _models_one_after_another(inst.fake_clock, DistributedDataParallel, models=3, steps=2)
    inst.at_exit()
    assert [[ref() is None for ref in refs] for refs in params] == [[True] * 4] * 3
    assert [log["samples"] for log in inst.fake.logs] == [4] * 6


@pytest.mark.parametrize(
    ("bad_d", "bad_g"),
    [((), ()), ((0,), ()), ((0, 1, 2), ()), ((0, 1, 2), (0, 1, 2)), ((), (1,))],
    ids=["none", "D's first", "every D", "every D and G", "G's second"],
)
def test_a_gan_iteration_under_a_grad_scaler_is_one_step_whichever_optimizer_it_skips(
    inst, bad_d, bad_g
):
    """DCGAN with AMP: one ``GradScaler`` steps the discriminator's optimizer, then the
    generator's, and updates once an iteration. A step the scaler skips (inf or NaN
    gradients: fp16's first steps) ends the iteration's step as the optimizer's own step
    would: the discriminator's ends it, the generator's joins it, skipped or not. Each
    iteration is one step of its batch, with the discriminator's loss."""
    clock = inst.fake_clock
    netD = DistributedDataParallel(Net(clock))
    netG = DistributedDataParallel(torch.nn.Linear(4, 4))
    optD, optG = timed_sgd(netD.parameters(), clock), timed_sgd(netG.parameters(), clock)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss_d = []
    for i, (x, _) in enumerate(_loader([4, 5, 3])):
        if i in bad_d:
            x = torch.full_like(x, math.nan)
        optD.zero_grad()
        err_real = netD(x).pow(2).mean()
        scaler.scale(err_real).backward()
        noise = torch.full((len(x), 4), math.nan) if i in bad_g else torch.randn(len(x), 4)
        fake = netG(noise)
        err_fake = (netD(fake.detach()) - 1).pow(2).mean()
        scaler.scale(err_fake).backward()
        scaler.step(optD)
        loss_d.append((err_real + err_fake).item())
        optG.zero_grad()
        scaler.scale(netD(fake).pow(2).mean()).backward()
        scaler.step(optG)
        scaler.update()
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [4, 5, 3]
    assert [log["loss"] for log in logs] == pytest.approx(loss_d, nan_ok=True)


def test_a_batch_of_the_scripts_own_kind_counts_nothing_and_the_iterator_is_not_kept(inst):
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)

    class Batch:  # neither a tensor nor a container of tensors
        def __init__(self, x):
            self.x = x

    loader = torch.utils.data.DataLoader(
        [torch.randn(3, 4)], batch_size=None, collate_fn=lambda x: Batch(x)
    )
    iterator = iter(loader)
    gone = weakref.ref(iterator)
    batch = next(iterator)
    model(batch.x).pow(2).mean().backward()
    opt.step()
    del iterator
    gc.collect()
    assert gone() is None  # known by id only: a worker-process iterator must be let go
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [0]


class ClippedSGD(torch.optim.SGD):
    """A user's optimizer: a subclass whose ``step`` adds its own work, then calls SGD's."""

    def __init__(self, params, clock):
        super().__init__(params, lr=0.01)
        self.clock = clock

    def step(self, closure=None):
        self.clock.advance(0.002)
        return super().step(closure)


@pytest.mark.parametrize("ddp", [True, False], ids=["ddp", "no-ddp"])
def test_a_subclassed_optimizer_is_one_step_when_its_base_class_is_hooked_too(inst, ddp):
    """torch wraps ``step`` of every optimizer class it made an instance of: once a plain SGD
    exists (here, or anywhere in the script), ClippedSGD's step runs the global hooks, then
    SGD's step inside it runs them again. One optimizer step is still one step, with DDP or
    without it (a model trained without DDP's forward hooks counted each step twice)."""
    clock = inst.fake_clock
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # SGD.step is hooked now
    model = DistributedDataParallel(Net(clock)) if ddp else Net(clock)
    opt = ClippedSGD(model.parameters(), clock)
    for _ in range(3):
        train_step(model, opt, clock)
    inst.flush()
    assert len(inst.fake.logs) == 3
    # without DDP the model its optimizer trains is found at the first step's end
    assert [log["samples"] for log in inst.fake.logs] == ([6, 6, 6] if ddp else [0, 6, 6])
    for log in inst.fake.logs:
        if ddp:
            assert log["phases"]["optimizer"] == pytest.approx(0.002)
            assert log["step_time"] == pytest.approx(sum(log["phases"][p] for p in PHASES))
        else:  # nor split: the step time alone
            assert log["phases"] is None


def test_zero_redundancy_optimizer_steps_once_per_step(inst):
    """ZeroRedundancyOptimizer's step runs its inner optimizer's step: hooks within hooks."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
    for _ in range(4):
        train_step(model, opt, clock)
    inst.flush()
    assert len(inst.fake.logs) == 4
    assert all(log["samples"] == 6 for log in inst.fake.logs)


def test_an_optimizer_step_that_raised_does_not_hide_the_next_steps(inst):
    """A step that raised between its hooks (its post hook never ran) is forgotten at the
    next forward: the steps after it count."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)

    def fail(optimizer, args, kwargs):
        raise RuntimeError("the script's own step failed")

    handle = opt.register_step_pre_hook(fail)
    with pytest.raises(RuntimeError, match="step failed"):
        train_step(model, opt, clock)
    handle.remove()
    for _ in range(2):
        train_step(model, opt, clock)
    inst.flush()
    assert len(inst.fake.logs) == 3


def test_the_inner_module_trained_without_ddp_makes_every_step(inst):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    for _ in range(3):  # e.g. micro-batches that skip DDP's hooks, through ``model.module``
        train_step(model.module, opt, clock)
    inst.flush()
    assert len(inst.fake.logs) == 4
    for log in inst.fake.logs[1:]:
        assert log["samples"] == 6
        assert log["phases"]["forward"] == pytest.approx(0.010)
        assert log["phases"]["backward"] == pytest.approx(0.020)
        assert log["step_time"] == pytest.approx(sum(log["phases"][p] for p in PHASES))


def test_the_heartbeat_knows_whether_the_rank_holds_a_ddp_module(inst):
    """Without one a rank's ``backward()`` waits for no gradient all-reduce (pytorch/examples'
    ImageNet script on the CPU makes none); without hooks to say, one may be there. Installing
    the hooks tells the heartbeat: a worker the script spawned installs them itself, and its
    beats said nothing of it (a backward without DDP read as a wait in one)."""
    import gc

    from ddptui.rank import heartbeat

    assert heartbeat._ddp_source is instrument.ddp_possible  # set by install, as a worker's
    try:
        assert not heartbeat.ddp_possible()
        model = DistributedDataParallel(torch.nn.Linear(4, 4))
        assert heartbeat.ddp_possible()
        del model
        gc.collect()
        assert not heartbeat.ddp_possible()  # gone: its weak reference says so
        inst.disabled = True  # hooks turned off by an internal error: nothing known
        assert heartbeat.ddp_possible()
        instrument.uninstall()
        assert heartbeat.ddp_possible()  # no hooks at all (--no-instrument)
    finally:
        heartbeat.set_ddp_source(None)
    assert heartbeat.ddp_possible()  # no source (a process the rank entry did not start)


def test_a_copy_or_a_pickle_of_the_watched_module_carries_none_of_ddptuis_hooks(inst, tmp_path):
    """torchvision's classification reference makes its EMA model after the DDP wrap
    (``AveragedModel(model.module)``, a ``deepcopy``): under ddptui it died with ``cannot
    pickle 'module' object`` (the hooks' instrument copied along), where plain torchrun ran.
    A copy (an EMA, a teacher) is not the DDP module's and is not watched; a module saved
    whole (``torch.save(model.module)``) loads where ddptui is not installed."""
    import copy
    import pickle

    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    ema = torch.optim.swa_utils.AveragedModel(model.module)
    twin = copy.deepcopy(model.module)
    calls = inst.hook_calls
    twin(torch.randn(2, 4))  # a teacher's forward, in training mode
    ema(torch.randn(2, 4))
    assert inst.hook_calls == calls
    train_step(model, opt, clock)
    assert inst.hook_calls > calls  # the module itself is still watched
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [6, 6]

    path = tmp_path / "whole.pt"
    torch.save(model.module, path)
    pickle.dumps(twin)
    code = (
        "import sys; sys.modules['ddptui'] = None\n"  # ddptui cannot be imported
        "import torch\n"
        f"m = torch.load({str(path)!r}, weights_only=False)\n"
        "print(tuple(m(torch.ones(1, 4)).shape))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPTUI")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(1, 4)"


class _Clamp:
    """A class TorchScript compiles (detectron2's box transforms): its names (``torch``)
    resolve in the frame that called ``torch.jit.script``."""

    def __init__(self, limit: float):
        self.limit = limit

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, max=self.limit)


def test_a_class_scripts_with_its_callers_names(inst):
    scripted = torch.jit.script(_Clamp)  # raised "undefined value torch": ddptui's frame
    assert torch.equal(scripted(1.0).apply(torch.tensor([0.5, 2.0])), torch.tensor([0.5, 1.0]))


def test_the_watched_module_scripts_traces_and_exports_as_without_ddptui(inst):
    """Saving the trained module for serving: ``torch.jit.script(model.module)`` compiles a
    module's forward hooks with it and failed on ddptui's (``try blocks aren't supported``);
    ``torch.jit.trace`` ran the hooks, and its forwards' traced batch sizes went into the
    next step's samples (``tensor(8)`` where 6 were trained), as ``torch.export`` did."""
    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    x = torch.randn(2, 4)
    scripted = torch.jit.script(model.module)
    with torch.no_grad():
        assert torch.equal(scripted(x), model.module(x))

    class Unscriptable(torch.nn.Module):
        def forward(self, x):
            return (lambda v: v * 2)(x)  # no lambdas in TorchScript

    with pytest.raises(Exception):  # noqa: B017 - TorchScript's own error, whatever its kind
        torch.jit.script(Unscriptable())  # raises with the hooks lifted: they come back
    torch.jit.trace(model.module, x)
    torch.export.export(model.module, (x,))  # in training mode: counted 2 samples more
    torch.jit.trace(model.module.eval(), x)
    model.train()
    calls = inst.hook_calls
    train_step(model, opt, clock)
    assert inst.hook_calls > calls  # the hooks are back on the module
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [6, 6]
    assert all(type(log["samples"]) is int for log in logs)
    assert logs[1]["phases"] is not None  # a DDP step's, from the hooks


def test_an_internal_error_turns_the_hooks_off_not_the_training(inst, monkeypatch, capsys):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)

    def broken(*args):
        raise ValueError("bug")

    monkeypatch.setattr(inst, "_transition", broken)
    for _ in range(2):
        train_step(model, opt, clock)  # trains on
    assert inst.disabled
    assert "instrumentation off after an internal error: ValueError: bug" in capsys.readouterr().err
    assert inst.fake.notes == [("instrument_off", {})]  # and the run is told, once


@pytest.mark.parametrize("backward", ["tensor", "autograd"])
@pytest.mark.parametrize("bad", [(), (0, 1), (0, 1, 2, 3)], ids=["none", "first two", "every one"])
def test_a_step_the_grad_scaler_skips_is_a_step(inst, bad, backward):
    """Each step's loss is the unscaled one (``GradScaler.scale`` is followed). fp16's first
    steps (the scale too high) or a run gone NaN: ``GradScaler.step`` skips the optimizer's
    step on inf or NaN gradients. Each iteration is still one step, of its own samples and
    time, with its own loss; skipped steps ran into the next (a step of 3 iterations, 9
    samples), and a run whose every step was skipped showed no step at all.
    ``torch.autograd.backward(loss)`` instead of ``loss.backward()``: the same steps and
    losses (no loss was seen there until huggingface/picotron's pipeline schedule)."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    losses = []
    for i in range(4):
        x = torch.full((3, 4), math.nan) if i in bad else torch.randn(3, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        if backward == "tensor":
            scaler.scale(loss).backward()
        else:
            torch.autograd.backward(scaler.scale(loss))
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert scaler.get_scale() == 1024.0 / 2 ** len(bad)  # the steps were skipped
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [3, 3, 3, 3]
    assert [log["loss"] for log in logs] == pytest.approx(losses, nan_ok=True)
    assert all(log["step_time"] == pytest.approx(0.030 + (i not in bad) * 0.003)
               for i, log in enumerate(logs[1:], 1))  # fmt: skip


def test_a_loss_that_takes_a_dropped_scaled_losss_address_is_its_own(inst):
    """``GradScaler.scale``'s result is followed to the ``backward()`` called on it, where
    the unscaled loss stands for it. One made and dropped unused (a script that scales a
    number to log it) leaves its address to the next tensor CPython makes: the loss
    backwarded next, when it took that address (here until one has), was read as the dropped
    one's unscaled value, not its own."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    reused, losses = False, []
    while not reused and len(losses) < 200:
        x = torch.randn(3, 4)
        dropped = id(scaler.scale(torch.tensor(100.0)))  # scaled and let go at once
        loss = model(x).pow(2).mean()
        reused = id(loss) == dropped
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    inst.flush()
    assert reused, "no loss took a dropped scaled one's address: the case is not made"
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(losses)


def test_a_closure_step_as_lightning_runs_it_has_each_phase_where_it_happens(inst):
    """``optimizer.step(closure)``, PyTorch Lightning's loop: forward and backward run inside
    the optimizer step. The batch wait and the framework's prelude are ``data``, the update
    after the closure ``optimizer`` (they were "other", "optimizer" and "data")."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.register_step_post_hook(lambda o, a, k: clock.advance(0.003))  # the update
    losses = []
    for _ in range(4):
        clock.advance(0.005)  # the next batch
        x = torch.randn(6, 4)

        def closure(x=x):
            clock.advance(0.001)  # the framework's prelude (callbacks, zero_grad)
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            losses.append(loss.item())
            return loss

        opt.step(closure)
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 4
    expected = {
        "data": 0.006, "forward": 0.010, "backward": 0.020, "comm": 0.0, "other": 0.0,
        "optimizer": 0.003, "eval": 0.0,
    }  # fmt: skip
    # the first step starts at its optimizer step, and shows the loop is one of closures
    assert logs[0]["phases"] == pytest.approx({**expected, "data": 0.001}, abs=1e-9)
    for log in logs[1:]:
        assert log["phases"] == pytest.approx(expected, abs=1e-9)
        assert log["step_time"] == pytest.approx(0.039, abs=1e-9)
    assert [log["samples"] for log in logs] == [6] * 4
    assert [log["loss"] for log in logs] == pytest.approx(losses)


def test_the_kept_losses_hold_no_autograd_graph_and_still_undo_the_division(inst):
    """The losses wait for the step's end: kept whole, each held its step's autograd graph
    alive until then (a slower step on CPU). A CPU's is kept as its value, read as its
    backward begins, and the division of gradient accumulation (``loss / 2``) is still read
    from the graph while it is there."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    means = []
    for _ in range(2):
        clock.advance(0.005)
        opt.zero_grad()
        micro = []
        for _ in range(2):
            loss = model(torch.randn(6, 4)).pow(2).mean()
            (loss / 2).backward()
            micro.append(loss.item())
        assert len(inst._losses) == 2
        assert all(type(kept) is float for kept in inst._losses)
        opt.step()
        means.append(sum(micro) / 2)
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(means)


def test_lbfgs_evaluating_its_closure_again_counts_the_batch_and_its_loss_once(inst):
    """LBFGS calls the closure up to ``max_iter`` times in one ``step``, on the same batch:
    each evaluation's forward added the batch again (samples and samples/s five times too
    many here) and its loss went into the step's mean."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=5)
    firsts = []
    for _ in range(3):
        clock.advance(0.005)
        x = torch.randn(6, 4)
        evaluations = []

        def closure(x=x, evaluations=evaluations):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            evaluations.append(loss.item())
            return loss

        returned = opt.step(closure)
        assert len(evaluations) > 1  # the line search did evaluate it again
        assert returned.item() == pytest.approx(evaluations[0])
        firsts.append(evaluations[0])
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [6] * 3
    assert [log["loss"] for log in logs] == pytest.approx(firsts)
    for log in logs:
        assert sum(log["phases"].values()) == pytest.approx(log["step_time"], abs=1e-9)


def test_a_ddp_wrapper_left_in_eval_mode_around_a_training_module_trains(inst):
    """PyTorch Lightning leaves its DDP wrapper in eval mode after its sanity check and puts
    only the LightningModule back in ``train()``: its steps were read as evaluations."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    model.eval()
    model.module.train()
    opt = timed_sgd(model.parameters(), clock)
    for _ in range(3):
        train_step(model, opt, clock)
    inst.flush()
    logs = inst.fake.logs
    assert len(logs) == 3
    for log in logs[1:]:
        assert log["phases"]["eval"] == 0.0
        assert log["phases"]["data"] == pytest.approx(0.005, abs=1e-9)
        assert log["phases"]["forward"] == pytest.approx(0.010, abs=1e-9)


def test_the_wrapped_torch_calls_take_every_argument_by_keyword(inst):
    """Frameworks call torch by keyword: Lightning's ``DistributedDataParallel(module=model,
    ...)`` failed under ddptui ("got multiple values for argument 'module'") and ran under
    plain torchrun."""
    clock = inst.fake_clock
    model = DistributedDataParallel(module=Net(clock), broadcast_buffers=False)
    opt = timed_sgd(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(epoch=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    losses = []
    for _ in range(2):
        loss = model(torch.randn(3, 4)).pow(2).mean()
        opt.zero_grad()
        scaler.scale(outputs=loss).backward(gradient=torch.tensor(1.0), retain_graph=False)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    inst.flush()
    assert [log["loss"] for log in inst.fake.logs] == pytest.approx(losses)
    assert [log["epoch"] for log in inst.fake.logs] == [2, 2]
    assert [log["samples"] for log in inst.fake.logs] == [3, 3]


class DataLoaderShard:
    """HF accelerate's prepared loader, as far as its epochs go: no DistributedSampler; its
    ``__iter__`` starts with ``set_epoch(self.iteration)`` and a finished pass adds one (the
    HF Trainer also calls ``set_epoch(epoch)`` itself)."""

    def __init__(self, batches):
        self.batches = batches
        self.iteration = 0

    def set_epoch(self, epoch):
        self.iteration = epoch

    def __iter__(self):
        self.set_epoch(self.iteration)
        yield from self.batches
        self.iteration += 1


@pytest.mark.parametrize("explicit", [False, True])
def test_an_accelerate_loaders_pass_is_the_epoch_and_an_evaluations_is_not(
    inst, monkeypatch, explicit
):
    """Accelerate (``Accelerator.prepare``, the HF Trainer) shards batches without a
    DistributedSampler: ddptui showed no epoch for such runs. An evaluation loader's passes,
    drawn between training steps (the Trainer's ``eval_steps``), are not the epoch."""
    fake_module(monkeypatch, "accelerate.data_loader", DataLoaderShard=DataLoaderShard)
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))  # accelerate.prepare makes it: hooks go on
    opt = timed_sgd(model.parameters(), clock)
    train = DataLoaderShard([torch.randn(3, 4) for _ in range(2)])
    evaluation = DataLoaderShard([torch.randn(3, 4)])
    for epoch in range(2):
        if explicit:
            train.set_epoch(epoch)
        for i, x in enumerate(train):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 0:
                model.eval()
                for _ in range(3):  # three evaluation passes: its iteration is 3, then 6
                    with torch.no_grad():
                        for xe in evaluation:
                            model(xe)
                model.train()
    inst.flush()
    assert [log["epoch"] for log in inst.fake.logs] == [0, 0, 1, 1]
    assert evaluation.iteration == 6
    # The script's own DistributedSampler.set_epoch afterwards (a plain loader): its word.
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(5)
    train_step(model, opt, clock)
    inst.flush()
    assert inst.fake.logs[-1]["epoch"] == 5
    instrument.uninstall()
    assert "__wrapped__" not in DataLoaderShard.__iter__.__dict__  # put back


class Trainer:
    """The HF Trainer, as far as its evaluations go: ``evaluate`` returns the metrics it
    logs, gathered from every rank, each named with its prefix; with several evaluation
    datasets it calls itself once per dataset (``eval_<name>_`` prefixes) and returns them
    all."""

    def __init__(self, model, batches, accuracy=None):
        self.model, self.batches, self.accuracy = model, batches, accuracy
        self.eval_dataset = None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        if eval_dataset is None and isinstance(self.eval_dataset, dict):
            eval_dataset = self.eval_dataset
        if isinstance(eval_dataset, dict):
            metrics = {}
            for name, data in eval_dataset.items():
                metrics.update(self.evaluate(data, None, f"{metric_key_prefix}_{name}"))
            return metrics
        self.model.eval()
        with torch.no_grad():
            loss = sum(self.model(x).pow(2).mean().item() for x in self.batches)
        self.model.train()
        metrics = {f"{metric_key_prefix}_loss": loss / len(self.batches)}
        if self.accuracy is not None:
            metrics[f"{metric_key_prefix}_accuracy"] = self.accuracy
        metrics[f"{metric_key_prefix}_runtime"] = 0.25
        metrics[f"{metric_key_prefix}_note"] = "text"  # not a number: left out
        metrics["epoch"] = 0.5
        return metrics


@pytest.mark.parametrize(("explicit", "ddp"), [(False, True), (True, True), (False, False)])
def test_the_hf_trainers_evaluations_are_reported(inst, monkeypatch, explicit, ddp):
    """The HF Trainer's ``eval_loss`` (and ``eval_accuracy``) were not picked up: the run
    said the script reports no evaluation. Each ``evaluate`` is one evaluation of the epoch
    training is in, unless the script reports its own. One process makes no DDP module: its
    evaluations count from its second step on."""
    import numpy as np

    fake_module(monkeypatch, "transformers.trainer", Trainer=Trainer)
    clock = inst.fake_clock
    # the Trainer makes a DDP module when it trains in several processes, none in one
    model = DistributedDataParallel(Net(clock)) if ddp else Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(2)
    trainer = Trainer(model, [torch.randn(3, 4)], accuracy=np.float64(0.75))
    if explicit:
        ddptui.log_eval(accuracy=0.5)  # the script's own
    train_step(model, opt, clock)
    if not ddp:
        train_step(model, opt, clock)
    first = trainer.evaluate()
    train_step(model, opt, clock)
    trainer.accuracy = None
    both = trainer.evaluate(eval_dataset={"a": [torch.randn(3, 4)], "b": [torch.randn(3, 4)]})
    trainer.eval_dataset = {"c": [torch.randn(3, 4)], "d_e": [torch.randn(3, 4)]}
    third = trainer.evaluate()  # the Trainer's own datasets, as its training loop evaluates
    inst.flush()
    if explicit:
        assert inst.fake.evals == [{"accuracy": 0.5}]  # the script's own, alone
        return
    assert len(inst.fake.evals) == 3  # the outermost call of each
    evaluation, several, own = inst.fake.evals
    assert evaluation == {"epoch": 2, "loss": first["eval_loss"], "accuracy": 0.75, "runtime": 0.25}
    assert type(evaluation["accuracy"]) is float
    # Several datasets: the first one's loss is the evaluation's, the others' come first.
    assert several == {
        "epoch": 2,
        "loss": both["eval_a_loss"],
        "accuracy": None,
        "b_loss": both["eval_b_loss"],
        "a_runtime": 0.25,
        "b_runtime": 0.25,
    }
    assert list(several)[:4] == ["epoch", "loss", "accuracy", "b_loss"]
    assert own["loss"] == third["eval_c_loss"] and own["d_e_loss"] == third["eval_d_e_loss"]
    assert len(inst.fake.logs) == (2 if ddp else 3)  # evaluation forwards are no steps
    instrument.uninstall()
    assert "__wrapped__" not in Trainer.evaluate.__dict__  # put back


@pytest.mark.parametrize(
    ("micro", "divide_by", "scaler", "expect"),
    [
        (2, 2, None, "undivided"),  # nanoGPT: loss / accumulation steps, each micro-batch
        (2, 2, "off", "undivided"),  # ...through a GradScaler switched off (its float32 path)
        (2, 2, "on", "undivided"),  # ...through a live GradScaler (float16)
        (10, 10, None, "undivided"),  # more micro-batches than the losses kept: folded
        (40, 40, "on", "undivided"),  # nanoGPT on one GPU: 40 micro-batches, four folds
        (20, 3, None, "as divided"),
        (12, None, None, "as divided"),
        (17, "window", None, "summed"),
        (2, 3, None, "as divided"),  # a division that is not the accumulation's
        (1, 4, None, "as divided"),  # one backward: nothing accumulated
        (2, None, None, "as divided"),  # accumulation without a division: the mean
        # The HF Trainer: each micro-batch's summed loss over the items of the whole window
        # (all its micro-batches, every rank), times the world size: the losses add up.
        (2, "window", None, "summed"),
        (3, "window", "on", "summed"),
        (1, "window", None, "summed"),
        (2, "window / 1", None, "summed"),  # and the accumulation's own division, by 1 there
        # ConvNeXt's ``loss /= update_freq`` (in place, after ``loss.item()``): its log's
        # epoch means to the digit (4.0414, 2.0398) under ddptui, 2 ranks, update_freq 2
        (2, "in place", None, "undivided"),
        (4, "in place", "on", "undivided"),
    ],
)
def test_a_loss_divided_by_its_micro_batches_is_reported_undivided(
    inst, micro, divide_by, scaler, expect
):
    """The loss the script has: ``loss = loss / accumulation_steps`` before each micro-batch's
    backward makes the gradient a mean; the step's loss is the micro-batches' mean loss, not
    the mean of the quotients (nanoGPT printed 4.18 where ddptui showed 2.09)."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    amp = None if scaler is None else torch.amp.GradScaler("cpu", enabled=scaler == "on")
    undivided = []
    for _ in range(2):
        opt.zero_grad()
        for _ in range(micro):
            loss = model(torch.randn(3, 4)).pow(2).mean()
            undivided.append(loss.item())
            if str(divide_by).startswith("window"):  # a mean over the window, as HF does
                loss = loss / torch.tensor(float(micro) * 2)
                loss *= 2  # its world size
                if divide_by == "window / 1":
                    loss = loss / 1
            elif divide_by == "in place":
                loss /= micro
            elif divide_by is not None:
                loss = loss / divide_by
            (amp.scale(loss) if amp else loss).backward()
        if amp:
            amp.step(opt)
            amp.update()
        else:
            opt.step()
    inst.flush()
    last = undivided[-micro:]  # every micro-batch's, however many (nanoGPT: 40 on one GPU)
    mean = sum(last) / len(last)
    if expect == "summed":
        expected = sum(value / micro for value in undivided[-micro:])  # = the window's mean
    else:
        expected = mean if expect == "undivided" else mean / (divide_by or 1)
    assert inst.fake.logs[-1]["loss"] == pytest.approx(expected)
    assert len(inst.fake.logs) == 2


class Stage:
    def __init__(self, value):
        self.value = value


class EvaluationLoop:
    """Lightning's ``_EvaluationLoop``, as far as ddptui reads it: ``run`` evaluates and
    returns, per loader, what ``self.log`` recorded for the epoch; ``_stage`` and
    ``trainer.sanity_checking`` say which evaluation it was."""

    def __init__(self, model, stage, outputs):
        self.model, self._stage, self.outputs = model, Stage(stage), outputs
        self.trainer = types.SimpleNamespace(sanity_checking=False)

    def run(self):
        with torch.no_grad():
            self.model(torch.randn(3, 4))
        return self.outputs


def test_lightnings_validations_are_reported(inst, monkeypatch):
    """Lightning's ``backbone_image_classifier.py`` under ddptui: two validations, and the
    run said the script reports no evaluation. Each validation past the sanity check is an
    evaluation of the epoch training is in: its loss and accuracy found by their names, the
    other numbers as extras; the sanity check and the test stage are none."""
    loop_module = instrument.LIGHTNING_LOOPS[0]  # lightning.pytorch's
    fake_module(monkeypatch, loop_module, _EvaluationLoop=EvaluationLoop)
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))  # the strategy wraps it before the check
    opt = timed_sgd(model.parameters(), clock)
    outputs = [
        {
            "val_recon_loss": torch.tensor(0.5),
            "val_loss_epoch": torch.tensor(0.25),
            "val/acc": torch.tensor(0.75),
            "epoch": 1.0,  # no extra: the evaluation's own field
            "val_confusion": torch.ones(2, 2),  # no number: left out, the rest still goes
            "val_note": "text",
            "val_loss_ok": True,
        },
        {"val_loss/dataloader_idx_1": 0.125},
    ]
    loop = EvaluationLoop(model, "validate", outputs)
    loop.trainer.sanity_checking = True
    loop.run()  # the sanity check, before training
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(3)
    loop.trainer.sanity_checking = False
    train_step(model, opt, clock)
    assert loop.run() is outputs  # returned as it was
    EvaluationLoop(model, "test", outputs).run()  # trainer.test(): no evaluation of training
    EvaluationLoop(model, "validate", [{"val_f1": 0.5}]).run()  # neither loss nor accuracy
    inst.flush()
    assert inst.fake.evals == [
        {
            "epoch": 3,
            "loss": outputs[0]["val_loss_epoch"],
            "accuracy": outputs[0]["val/acc"],
            "val_recon_loss": outputs[0]["val_recon_loss"],
            "val_loss/dataloader_idx_1": 0.125,
        }
    ]
    instrument.uninstall()
    assert "__wrapped__" not in EvaluationLoop.run.__dict__  # put back


class Metric(torch.nn.Module):
    """torchmetrics' ``Metric`` as far as ddptui meets it: made, it wraps its ``compute``
    (``_wrap_compute``; the real one gathers the state from every rank there); called on a
    batch (``forward``), it updates its state and returns the batch's own value, computed
    (unsynchronised) inside the forward."""

    def __init__(self):
        super().__init__()
        self.right = self.seen = 0
        self.compute = self._wrap_compute(self.compute)

    def _wrap_compute(self, compute):
        return lambda *args, **kwargs: compute(*args, **kwargs)

    def forward(self, preds, target):
        kept = (self.right, self.seen)
        self.right = self.seen = 0
        self.update(preds, target)
        batch = self.compute()
        self.right, self.seen = self.right + kept[0], self.seen + kept[1]
        return batch

    def update(self, preds, target):
        self.right += int((preds.argmax(-1) == target).sum())
        self.seen += len(target)

    def compute(self):
        return torch.tensor(self.right / self.seen)


class MulticlassAccuracy(Metric):
    pass


class MeanSquaredError(Metric):
    def compute(self):
        return torch.tensor(0.5)


def test_a_torchmetrics_accuracy_computed_after_an_evaluation_is_its_accuracy(inst, monkeypatch):
    """Lightning Fabric's examples: ``Accuracy`` called on each evaluation batch (each call
    computes the batch's own value), then ``compute()`` once the pass is over (every rank's
    state gathered): that is the evaluation's accuracy, of the epoch training is in. Not
    each batch's, not one computed after training and before the evaluation (a training
    accuracy), not twice for the same pass, not another kind of metric's."""
    fake_module(monkeypatch, "torchmetrics.metric", Metric=Metric)

    class MetricLoggingLoop(EvaluationLoop):
        """A Lightning validation whose module logs a torchmetrics accuracy: Lightning's
        evaluation, reported as Lightning's, once."""

        def run(self):
            outputs = EvaluationLoop.run(self)
            self.outputs[0]["val_acc"] = acc.compute()  # ``self.log("val_acc", self.acc)``
            return outputs

    fake_module(monkeypatch, instrument.LIGHTNING_LOOPS[0], _EvaluationLoop=MetricLoggingLoop)
    clock = inst.fake_clock
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 3))  # torchmetrics followed from here
    opt = timed_sgd(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    train_acc, acc, mse = MulticlassAccuracy(), MulticlassAccuracy(), MeanSquaredError()
    batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]

    def evaluate():
        model.eval()
        with torch.no_grad():
            for x, y in batches:
                acc(model(x), y)  # the batch's own accuracy: no evaluation
        model.train()
        mse.compute()  # not an accuracy
        return acc.compute()

    for epoch in (1, 2):
        sampler.set_epoch(epoch)
        model.eval()
        with torch.no_grad():
            model(batches[0][0])  # a look at the model before training (no accuracy taken)
        model.train()
        for _, y in batches:
            train_step(model, opt, clock)
            train_acc.update(torch.randn(8, 3), y)
        train_acc.compute()  # the training's, before any evaluation
        value = evaluate()
        assert acc.compute() == value  # computed again to print it: once
        acc.right = acc.seen = 0
    train_step(model, opt, clock)
    acc.update(torch.randn(8, 3), batches[0][1])
    MetricLoggingLoop(model, "validate", [{"val_loss": 0.5}]).run()
    train_acc.update(torch.randn(8, 3), batches[0][1])
    train_acc.compute()  # ``self.log("train_acc", …)`` at the epoch's end: the training's
    inst.flush()
    evals = inst.fake.evals
    assert [e["epoch"] for e in evals] == [1, 2, 2]
    assert [e["loss"] for e in evals] == [None, None, 0.5]  # the last one Lightning's
    assert 0.0 <= float(evals[0]["accuracy"]) <= 1.0
    assert float(evals[1]["accuracy"]) == float(value)
    instrument.uninstall()
    assert "__wrapped__" not in Metric.__dict__["forward"].__dict__  # put back


def test_an_ignite_evaluators_metrics_are_its_evaluation_not_a_training_sets(inst):
    """PyTorch Ignite (its CIFAR-10 example and ImageNet reference): at each epoch's end the
    trainer's handler runs evaluators with ``Accuracy`` and ``Loss`` attached (all-reduced
    when the run completes): over the training loader itself, over a ``Subset`` of the
    training set, then over the validation set, the other part of a ``random_split`` of one
    dataset. The validation set's are the epoch's evaluation; the training set's are not
    one, during training or after it; a metric of several values (per-class precision) is no
    number to report. The trainer's ``max_epochs`` is the run's plan (its epochs and ETA
    without ``--epochs``)."""
    from ignite.engine import Engine, Events
    from ignite.metrics import Accuracy, Loss, Precision

    clock = inst.fake_clock
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 3))
    opt = timed_sgd(model.parameters(), clock)
    criterion = torch.nn.CrossEntropyLoss()
    full = torch.utils.data.TensorDataset(torch.randn(36, 4), torch.randint(0, 3, (36,)))
    train_ds, val_ds = torch.utils.data.random_split(full, [24, 12])
    sampler = torch.utils.data.distributed.DistributedSampler(train_ds, num_replicas=1, rank=0)
    train_loader = torch.utils.data.DataLoader(train_ds, batch_size=8, sampler=sampler)
    part = torch.utils.data.Subset(train_ds, range(12))
    loaders = {
        "train": train_loader,
        "train part": torch.utils.data.DataLoader(part, batch_size=12),
        "val": torch.utils.data.DataLoader(val_ds, batch_size=12),
    }

    def train(engine, batch):
        x, y = batch
        model.train()
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    def evaluate(engine, batch):
        model.eval()
        with torch.no_grad():
            return model(batch[0]), batch[1]

    trainer = Engine(train)
    evaluators = {}
    for name in loaders:
        evaluator = evaluators[name] = Engine(evaluate)
        Accuracy().attach(evaluator, "Accuracy")
        Loss(criterion).attach(evaluator, "Loss")
        Precision().attach(evaluator, "Precision")
    seen = []

    @trainer.on(Events.EPOCH_STARTED)
    def set_epoch(engine):
        sampler.set_epoch(engine.state.epoch - 1)

    @trainer.on(Events.EPOCH_COMPLETED)
    def validate(engine):
        for name, evaluator in evaluators.items():
            state = evaluator.run(loaders[name])
            if name == "val":
                seen.append(dict(state.metrics))

    trainer.run(train_loader, max_epochs=2)
    assert inst.fake.announced == [{"epochs": 2}]  # the trainer's plan, not an evaluator's
    for name in ("train", "train part"):  # after training: still the training set
        evaluators[name].run(loaders[name])
    inst.flush()
    evals = inst.fake.evals
    assert [e["epoch"] for e in evals] == [0, 1], evals
    for e, metrics in zip(evals, seen, strict=True):
        assert e["accuracy"] == metrics["Accuracy"] and e["loss"] == metrics["Loss"]
        assert set(e) <= {"epoch", "accuracy", "loss"}, e  # no precision per class
    seen.append(dict(evaluators["val"].run(loaders["val"]).metrics))  # after training
    inst.flush()
    assert [e["epoch"] for e in inst.fake.evals] == [0, 1, 1]
    assert inst.fake.evals[-1]["accuracy"] == seen[-1]["Accuracy"]
    instrument.uninstall()
    assert "__wrapped__" not in Engine.__dict__["run"].__dict__  # put back


class FastaiMetric:
    """A fastai metric as its Recorder holds it: a ``name`` and the ``value`` of the pass."""

    def __init__(self, name, value):
        self.name, self.value = name, value


class Recorder:
    """fastai's ``Recorder`` as far as the hooks read it (fastai 2.8): ``after_validate`` ends
    a validation, and ``_valid_mets`` is its loss (``AvgLoss``, named ``loss``) and the
    learner's metrics, none when the validation was cancelled."""

    def __init__(self, metrics):
        self.metrics, self.cancel_valid, self.log = metrics, False, []
        self.learn = types.SimpleNamespace(cbs=[self])

    @property
    def _valid_mets(self):
        return [] if self.cancel_valid else self.metrics

    def after_validate(self):
        self.log += [m.value for m in self._valid_mets]


class Learner:
    """fastai's ``Learner`` as far as its plan goes: ``fit(n_epoch)``, which
    ``fit_one_cycle`` and the others call."""

    def fit(self, n_epoch, lr=None, wd=None, cbs=None, reset_opt=False, start_epoch=0):
        self.n_epoch = n_epoch


class FastaiOptimizer:
    """fastai's ``Optimizer`` as far as the hooks see it: no ``torch.optim.Optimizer``; its
    step (here plain SGD) takes ``seconds`` of the fake clock."""

    def __init__(self, params, clock, seconds=0.004):
        self.params, self.clock, self.seconds = list(params), clock, seconds

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self, closure=None):
        self.clock.advance(self.seconds)
        with torch.no_grad():
            for p in self.params:
                p.add_(p.grad, alpha=-0.01)


def test_a_fastai_learners_validation_is_its_evaluation(inst, monkeypatch):
    """fastai's ``distrib.py`` example (``learn.distrib_ctx()``, ``fit_flat_cos``): each epoch
    ends with a validation whose loss and metrics fastai gathers over the ranks; it prints
    them as its table (valid_loss, accuracy, top_k_accuracy), and ddptui said the script
    reported no evaluation. A cancelled validation is none, nor a pass of ``get_preds``
    (a test set's loss and accuracy were reported as the last epoch's); a script that
    reports its own evaluations keeps them its own. Its optimizer, none of torch's, is
    followed too."""
    fake_module(monkeypatch, "fastai.learner", Recorder=Recorder)
    fake_module(monkeypatch, "fastai.optimizer", Optimizer=FastaiOptimizer)
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))  # fastai followed from here
    opt = FastaiOptimizer(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    loss, accuracy = FastaiMetric("loss", torch.tensor(3.2)), FastaiMetric("accuracy", 0.15)
    recorder = Recorder([loss, accuracy, FastaiMetric("top_k_accuracy", torch.tensor(0.6))])
    scaler = torch.amp.GradScaler("cuda", enabled=False)  # fastai's to_fp16() on a CPU

    class MixedPrecision:  # fastai's: the scaler's stand-in optimizer, before the real one
        def step(self):
            self.skipped = False

    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        clock.advance(0.005)
        objective = model(torch.randn(6, 4)).pow(2).mean()
        opt.zero_grad()
        objective.backward()
        scaler.step(MixedPrecision())
        opt.step()
        recorder.after_validate()
    recorder.cancel_valid = True
    recorder.after_validate()

    class GatherPredsCallback:  # fastai's, among the learner's callbacks while get_preds runs
        pass

    recorder.cancel_valid = False
    recorder.learn.cbs.append(GatherPredsCallback())
    recorder.after_validate()  # learn.get_preds(dl=test_dl): predictions, no validation
    recorder.learn.cbs.pop()
    recorder.log = recorder.log[:-3]
    inst.flush()
    evals = inst.fake.evals
    assert [e["epoch"] for e in evals] == [0, 1]
    assert [(float(e["loss"]), e["accuracy"]) for e in evals] == [(pytest.approx(3.2), 0.15)] * 2
    assert float(evals[0]["top_k_accuracy"]) == pytest.approx(0.6)
    assert recorder.log == [loss.value, 0.15, recorder.metrics[2].value] * 2  # as before
    # fastai's optimizer: its step is the optimizer phase and ends the step, as torch's does
    # (after the scaler's stand-in, not at it: each step's own optimizer in it)
    assert len(inst.fake.logs) == 2 and inst.fake.logs[-1]["samples"] == 6
    assert [log["phases"]["optimizer"] for log in inst.fake.logs] == pytest.approx([0.004] * 2)
    ddptui.log_eval(epoch=1, accuracy=0.5)  # the script's own: fastai's are not reported
    recorder.cancel_valid = False
    recorder.after_validate()
    inst.flush()
    assert [e["accuracy"] for e in inst.fake.evals] == [0.15, 0.15, 0.5]
    instrument.uninstall()
    assert "__wrapped__" not in Recorder.__dict__["after_validate"].__dict__  # put back


class SpeechBrainStage(enum.Enum):
    """SpeechBrain's ``speechbrain.core.Stage``."""

    TRAIN = enum.auto()
    VALID = enum.auto()
    TEST = enum.auto()


class Brain:
    """SpeechBrain's ``Brain`` (1.1) as far as the hooks see it: ``_fit_valid`` validates
    (the modules in eval mode, no gradients, the batches' losses averaged) and hands the
    mean to ``on_stage_end``, the script's override; ``evaluate`` tests the same way."""

    def __init__(self, model, batches):
        self.model, self.batches = model, batches

    def _run(self, stage, epoch):
        self.model.eval()
        average = 0.0
        with torch.no_grad():
            for n, batch in enumerate(self.batches, start=1):
                loss = self.model(batch).pow(2).mean()
                average += (float(loss) - average) / n
        self.model.train()
        self.on_stage_end(stage, average, epoch)
        return average

    def _fit_valid(self, valid_set, epoch, enable):
        if valid_set is not None:
            return self._run(SpeechBrainStage.VALID, epoch)
        return None

    def evaluate(self, test_set):
        return self._run(SpeechBrainStage.TEST, None)

    def fit(self, epoch_counter, train_set, valid_set=None, progressbar=None):
        self.fitted = epoch_counter.limit

    def on_stage_end(self, stage, stage_loss, epoch=None):
        pass


def test_a_speechbrain_brains_validation_loss_is_its_evaluation(inst, monkeypatch):
    """SpeechBrain's LM template under ddptui (2 ranks, gloo): each epoch ended with a
    validation whose loss SpeechBrain logs (``valid loss: 5.67``), and ddptui said the script
    reported no evaluation. The loss its ``on_stage_end`` gets is the epoch's evaluation;
    no validation set, the test stage, or a script that reports evaluations itself: none.
    The script's ``on_stage_end`` runs as before, and the brain keeps no attribute of ours."""
    fake_module(monkeypatch, "speechbrain.core", Brain=Brain, Stage=SpeechBrainStage)
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))  # SpeechBrain followed from here
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)

    class LM(Brain):
        def __init__(self, *args):
            super().__init__(*args)
            self.seen = []

        def on_stage_end(self, stage, stage_loss, epoch=None):
            self.seen.append((stage.name, round(stage_loss, 6), epoch))

    batches = [torch.randn(4, 4) for _ in range(3)]
    brain = LM(model, batches)
    losses = []
    for epoch in (1, 2):
        sampler.set_epoch(epoch)
        train_step(model, opt, clock)
        losses.append(brain._fit_valid(batches, epoch, enable=True))
    assert brain._fit_valid(None, 3, enable=True) is None  # no validation set
    brain.evaluate(batches)  # the test stage: no epoch's evaluation
    inst.flush()
    evals = inst.fake.evals
    assert [(e["epoch"], e["loss"]) for e in evals] == [
        (1, pytest.approx(losses[0])),
        (2, pytest.approx(losses[1])),
    ]
    assert all(e.get("accuracy") is None for e in evals)
    assert [stage for stage, _, _ in brain.seen] == ["VALID", "VALID", "TEST"]
    assert "on_stage_end" not in vars(brain)
    ddptui.log_eval(epoch=2, accuracy=0.5)  # the script's own: SpeechBrain's are not reported
    brain._fit_valid(batches, 2, enable=True)
    inst.flush()
    assert len(inst.fake.evals) == 3 and inst.fake.evals[-1]["accuracy"] == 0.5
    instrument.uninstall()
    assert "__wrapped__" not in Brain.__dict__["_fit_valid"].__dict__  # put back


@pytest.mark.parametrize("framework", ["hf", "lightning", "fastai", "speechbrain"])
@pytest.mark.parametrize("cut", [False, True])
def test_a_frameworks_planned_epochs_are_announced_once(inst, monkeypatch, framework, cut):
    """SpeechBrain's LM template, 2 epochs (its ``number_of_epochs``), under ddptui without
    ``--epochs``: its progress and ETA said "epochs unknown: --epochs N". The epochs a
    framework plans are announced with the rank, once: the HF Trainer's
    ``state.num_train_epochs`` and Lightning's ``max_epochs`` where no ``max_steps`` ends the
    run first (``cut``: none then), fastai's ``fit(n_epoch)``, SpeechBrain's epoch counter's
    ``limit``. Nothing out of
    range (0, a bool, a float, more than a million)."""
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    if framework == "hf":
        fake_module(monkeypatch, "transformers.trainer", Trainer=StepTrainer)
        model = DistributedDataParallel(Net(clock))  # the Trainer followed from here
        trainer = StepTrainer(model)
        trainer.args = types.SimpleNamespace(max_steps=40 if cut else -1)
        for epochs in (3, 3, 3, True, 2.0, 0, 10**7):
            trainer.state = types.SimpleNamespace(num_train_epochs=epochs)
            trainer.training_step(model, torch.randn(6, 4))
            opt.step()
    elif framework == "lightning":
        loop_module = "lightning.pytorch.loops.training_epoch_loop"
        fake_module(monkeypatch, loop_module, _TrainingEpochLoop=TrainingEpochLoop)
        model = DistributedDataParallel(Net(clock))
        data = torch.utils.data.TensorDataset(torch.randn(12, 4))
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        for epochs in (3, 3, None, -1):
            loop = TrainingEpochLoop(model, opt, loader, 3, 1)
            loop.trainer.max_epochs, loop.trainer.max_steps = epochs, 7 if cut else -1
            loop.run()
    elif framework == "fastai":
        fake_module(monkeypatch, "fastai.learner", Recorder=Recorder, Learner=Learner)
        model = DistributedDataParallel(Net(clock))
        learner = Learner()
        for n_epoch in (3, 3, -1):
            learner.fit(n_epoch, lr=0.01)
        learner.fit(n_epoch=3)
        assert learner.n_epoch == 3  # fastai's fit as before
        cut = False
    else:
        fake_module(monkeypatch, "speechbrain.core", Brain=Brain, Stage=SpeechBrainStage)
        model = DistributedDataParallel(Net(clock))
        brain = Brain(model, [])
        for limit in (3, 3, 0, 3.5):
            brain.fit(types.SimpleNamespace(limit=limit), None)
        assert brain.fitted == 3.5  # SpeechBrain's fit as before
        cut = False  # SpeechBrain's counter is its plan
    inst.flush()
    assert inst.fake.announced == ([] if cut else [{"epochs": 3}])


@pytest.mark.parametrize(("accumulate", "steps"), [(1, 10), (2, 5), (3, 3)])
def test_a_training_loaders_length_says_how_many_steps_an_epoch_makes(inst, accumulate, steps):
    """The first training pass over a DataLoader of 10 batches, ``accumulate`` batches a
    step (gradient accumulation: the HF Trainer's ``gradient_accumulation_steps``): 10 //
    ``accumulate`` steps an epoch, sent once, with the second step. Its evaluation loader
    (under no_grad) and a later pass say nothing. Once the script calls ``ddptui.log``, the
    steps it reports are its own: the note is taken back."""
    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = timed_sgd(model.parameters(), clock)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    evaluation = torch.utils.data.DataLoader(data, batch_size=20)
    for _ in range(2):
        with torch.no_grad():
            for (x,) in evaluation:
                model(x)
        for i, (x,) in enumerate(loader):
            model(x).pow(2).mean().backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
    inst.flush()
    assert inst.fake.notes == [("loader_steps", {"steps": steps})]
    ddptui.log(loss=1.0)  # the script reports its own steps from now on: taken back
    assert inst.fake.notes[1:] == [("loader_steps", {})]


@pytest.mark.parametrize(("accumulate", "steps"), [(1, 10), (2, 5)])
def test_a_step_that_draws_from_two_loaders_is_one_step_of_the_first_ones_pass(
    inst, accumulate, steps
):
    """A second loader zipped with the training loader (unlabelled data, a second domain):
    each step draws a batch from each, and the epoch is the first pass's 10 steps, not 5;
    with gradient accumulation over the pairs, 10 // ``accumulate``."""
    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = timed_sgd(model.parameters(), clock)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4))
    pairs = zip(
        torch.utils.data.DataLoader(data, batch_size=4),
        torch.utils.data.DataLoader(data, batch_size=4),
        strict=True,
    )
    for i, ((x,), (y,)) in enumerate(pairs):
        (model(x).pow(2).mean() + model(y).abs().mean()).backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
    inst.flush()
    assert inst.fake.notes == [("loader_steps", {"steps": steps})]


class TrainingEpochLoop:
    """Lightning's ``_TrainingEpochLoop`` as far as ddptui meets it: its ``run`` takes the
    epoch's batches, at most ``trainer.num_training_batches`` (``limit_train_batches``)."""

    def __init__(self, model, opt, loader, batches, accumulate):
        self.trainer = types.SimpleNamespace(num_training_batches=batches)
        self.model, self.opt, self.loader, self.accumulate = model, opt, loader, accumulate

    def run(self, data_fetcher=None):
        for i, (x,) in enumerate(self.loader):
            if i == self.trainer.num_training_batches:
                break
            self.model(x).pow(2).mean().backward()
            if (i + 1) % self.accumulate == 0:
                self.opt.step()
                self.opt.zero_grad()


class Stream(torch.utils.data.IterableDataset):
    """40 samples with no length."""

    def __iter__(self):
        return iter(torch.randn(40, 4).unbind())


@pytest.mark.parametrize(
    ("accumulate", "steps", "lengthless"), [(1, 4, False), (2, 2, False), (1, 4, True)]
)
def test_lightnings_limit_on_an_epochs_batches_is_the_epochs_length(
    inst, monkeypatch, accumulate, steps, lengthless
):
    """Lightning's backbone example with ``limit_train_batches 20`` on 2 ranks: its loader
    holds 860 batches a rank, and ddptui took an epoch for 860 steps (the first epoch's ETA
    43 times too long). Lightning's own count of the epoch's batches caps the loader's, and
    is the length of one that has none (an IterableDataset)."""
    loop_module = "lightning.pytorch.loops.training_epoch_loop"
    fake_module(monkeypatch, loop_module, _TrainingEpochLoop=TrainingEpochLoop)
    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Linear(4, 1))  # the strategy wraps it first
    opt = timed_sgd(model.parameters(), clock)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 10 batches
    if lengthless:  # an IterableDataset: only Lightning's limit says how long an epoch is
        loader = torch.utils.data.DataLoader(
            Stream(), batch_size=4, collate_fn=lambda b: (torch.stack(b),)
        )
    for _ in range(2):
        TrainingEpochLoop(model, opt, loader, 4, accumulate).run()
    inst.flush()
    assert inst.fake.notes == [("loader_steps", {"steps": steps})]
    instrument.uninstall()
    assert "__wrapped__" not in TrainingEpochLoop.run.__dict__  # put back


def test_a_loader_without_a_length_says_nothing(inst):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return (torch.randn(4) for _ in range(12))

    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = timed_sgd(model.parameters(), clock)
    for x in torch.utils.data.DataLoader(Stream(), batch_size=4):
        model(x).pow(2).mean().backward()
        opt.step()
    inst.flush()
    assert inst.fake.notes == []


def test_a_script_that_reports_its_own_steps_from_the_start_says_nothing_of_its_loader(inst):
    """``ddptui.log`` every 10th step: the steps the rank reports are not the loader's."""
    clock = inst.fake_clock
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = timed_sgd(model.parameters(), clock)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4))
    ddptui.log(loss=2.0)
    for i, (x,) in enumerate(torch.utils.data.DataLoader(data, batch_size=4)):
        model(x).pow(2).mean().backward()
        opt.step()
        if i % 10 == 9:
            ddptui.log(loss=1.0)
    inst.flush()
    assert inst.fake.notes == []


@pytest.mark.parametrize(
    ("names", "loss", "accuracy"),
    [
        (["val_loss", "val_acc"], "val_loss", "val_acc"),
        (["valid_loss_epoch"], "valid_loss_epoch", None),
        (["val/recon_loss", "val/loss", "val/accuracy"], "val/loss", "val/accuracy"),
        (["val_top1", "val_acc5_x"], None, "val_top1"),
        (["lossless_f1", "accurate"], None, None),  # words, not letters in a word
        (["Val-Loss", "VAL_ACC1"], "Val-Loss", "VAL_ACC1"),
        ([], None, None),
    ],
)
def test_a_logged_number_is_a_loss_or_an_accuracy_by_its_words(names, loss, accuracy):
    assert instrument._metric_named(names, instrument.LOSS_WORDS) == loss
    assert instrument._metric_named(names, instrument.ACCURACY_WORDS) == accuracy


class StepTrainer:
    """The HF Trainer, as far as its training loss goes: ``training_step`` runs one
    micro-batch's forward and ``backward()``; where the model takes ``num_items_in_batch``
    (``average_tokens_across_devices=False``), its loss is the micro-batch's summed loss over
    the items of the whole window on this rank, so that the micro-batches' losses add up to
    the window's mean loss, the figure the Trainer logs."""

    def __init__(self, model):
        self.model = model

    def training_step(self, model, inputs, num_items_in_batch=None):
        summed = model(inputs).pow(2).sum()
        loss = summed / num_items_in_batch if num_items_in_batch is not None else summed
        loss.backward()
        return loss.detach()


@pytest.mark.parametrize("ddp", [True, False])
def test_the_hf_trainers_loss_over_its_window_is_its_sum(inst, monkeypatch, ddp):
    """An HF Trainer run with gradient accumulation and ``average_tokens_across_devices``
    off: the Trainer logged 5.39 where ddptui showed 2.69 (two micro-batches, each divided by
    the window's items: a division the graph cannot tell from a mean's). A step whose
    micro-batches went through ``training_step`` reports their sum, as the Trainer logs it;
    the same division outside the Trainer is still taken as the script's mean."""
    fake_module(monkeypatch, "transformers.trainer", Trainer=StepTrainer)
    clock = inst.fake_clock
    # The Trainer makes a DDP module when it trains in several processes (and ddptui
    # follows it from then on), none in one (followed from the second step on).
    model = DistributedDataParallel(Net(clock)) if ddp else Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    trainer = StepTrainer(model)
    if not ddp:
        train_step(model, opt, clock)
        train_step(model, opt, clock)
    figures = []
    for through_trainer in (True, False, True):
        batches = [torch.randn(3, 4), torch.randn(3, 4)]
        items = torch.tensor(float(sum(len(b) for b in batches)))  # the window's items
        opt.zero_grad()
        losses = []
        for x in batches:
            if through_trainer:
                losses.append(trainer.training_step(model, x, items).item())
            else:  # the same division in a script of its own: a mean's, as far as anyone knows
                loss = model(x).pow(2).sum() / items
                loss.backward()
                losses.append(loss.item())
        opt.step()
        figures.append((sum(losses), sum(losses) / len(losses)))
    inst.flush()
    reported = [log["loss"] for log in inst.fake.logs[-3:]]
    assert reported[0] == pytest.approx(figures[0][0])  # the sum: the Trainer's figure
    assert reported[1] == pytest.approx(figures[1][1])  # outside it: the mean, as before
    assert reported[2] == pytest.approx(figures[2][0])
    instrument.uninstall()
    assert "__wrapped__" not in StepTrainer.training_step.__dict__  # put back


@pytest.mark.parametrize(
    "env, wanted",
    [
        ({}, False),
        ({ENDPOINT_ENV: "tcp://127.0.0.1:1"}, True),
        ({ENDPOINT_ENV: "tcp://127.0.0.1:1", NO_INSTRUMENT_ENV: "1"}, False),
        ({ENDPOINT_ENV: "tcp://127.0.0.1:1", NO_INSTRUMENT_ENV: "yes"}, False),
        ({ENDPOINT_ENV: "tcp://127.0.0.1:1", NO_INSTRUMENT_ENV: "0"}, True),
    ],
)
def test_wanted_only_under_ddptui_and_not_switched_off(env, wanted):
    assert instrument.wanted(env) is wanted


@pytest.mark.slow
def test_install_waits_for_the_script_to_import_torch_and_what_it_follows(tmp_path):
    code = """
import sys
from ddptui.rank import instrument
inst = instrument.install(force=True)
assert "torch" not in sys.modules, "installing must not import torch"
import json  # any other import passes through
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
assert inst.torch is torch
assert DDP.__init__.__wrapped__ is not None
assert torch.Tensor.backward.__wrapped__ is not None
assert type(torch.__spec__.loader).__name__ != "_NotifyingLoader"
assert "torch._dynamo" not in sys.modules, "attaching must not import torch.compile's tracer"
import torch._dynamo
assert torch._dynamo.trace_rules.check_file(instrument.__file__).skipped
assert torch._dynamo.trace_rules.check_file(instrument.ddptui.__file__).skipped
assert not inst._torchmetrics_attached
import torchmetrics.metric  # the script's metrics library, imported after torch
assert inst._torchmetrics_attached
assert torchmetrics.metric.Metric.forward.__wrapped__ is not None
print("ok")
"""
    metrics = tmp_path / "torchmetrics"  # a stand-in: torchmetrics is not a dependency
    metrics.mkdir()
    (metrics / "__init__.py").write_text("")
    (metrics / "metric.py").write_text(
        "class Metric:\n"
        "    def _wrap_compute(self, compute):\n        return compute\n"
        "    def forward(self, *args):\n        return None\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{os.getcwd()}{os.pathsep}{tmp_path}"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_compiled_ddp_module_steps_without_compiling_the_hooks(inst, monkeypatch):
    """``torch.compile(DDP(model))``, the order torch's DDP notes advise: dynamo traces the
    DDP module's call, hooks included. It must run them as they are (a call between two
    compiled parts), not trace them: traced, each broke the graph at its clock read, and
    guards on the instrument's state recompiled them on the following steps."""
    from torch._dynamo import trace_rules

    package = os.path.dirname(ddptui.__file__)
    met = []  # (file, skipped) for each of ddptui's files dynamo decided on
    check_file = trace_rules.check_file

    def recording(filename, is_inlined_call=False):
        result = check_file(filename, is_inlined_call)
        if filename and filename.startswith(package):
            met.append((os.path.basename(filename), result.skipped))
        return result

    monkeypatch.setattr(trace_rules, "check_file", recording)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = torch.compile(DistributedDataParallel(net), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        losses = [train_step(model, opt, inst.fake_clock, batch=6 + i).item() for i in range(4)]
        inst.flush()
    finally:
        torch._dynamo.reset()
    assert any(f == "instrument.py" for f, _ in met), "dynamo never met the hooks: no test"
    assert all(skipped for _, skipped in met), met
    steps = inst.fake.logs
    assert [s["samples"] for s in steps] == [6, 7, 8, 9]
    assert [s["loss"] for s in steps] == pytest.approx(losses)


def test_a_torch_without_dynamos_skip_list_says_so_once_and_trains(inst, capsys):
    inst._skip_in_dynamo(types.SimpleNamespace())  # a torch whose dynamo has no trace_rules
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch.compile would trace its hooks" in err
    model = DistributedDataParallel(Net(inst.fake_clock))
    opt = timed_sgd(model.parameters(), inst.fake_clock)
    train_step(model, opt, inst.fake_clock)
    train_step(model, opt, inst.fake_clock)
    inst.flush()
    assert len(inst.fake.logs) == 2


def test_uninstall_restores_torch(inst):
    from torch.utils.data import dataloader

    patched = torch.Tensor.backward
    assert hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__")
    instrument.uninstall()
    assert torch.Tensor.backward is not patched
    assert not hasattr(torch.Tensor.backward, "__wrapped__")
    assert not hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__")


def _real_cuda_steps(inst, ddp):
    """Ten SGD steps of a small MLP on GPU 0 (in DDP or not), every step's events read:
    (the steps sent, the losses as the script had them)."""
    inst.clock = __import__("time").perf_counter  # real time: the device's events are real
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    model = net.to(device)
    if ddp:
        model = DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    losses = []
    for _ in range(10):
        loss = model(torch.randn(64, 256, device=device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    inst.flush(timeout=10.0)
    return inst.fake.logs, losses


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_steps_carry_device_phases_and_loss(inst):
    logs, losses = _real_cuda_steps(inst, ddp=True)
    assert len(logs) == 10
    for log, loss in zip(logs, losses, strict=True):
        assert set(PHASES) <= set(log["phases"])
        assert log["phases"]["forward"] > 0 and log["phases"]["backward"] > 0
        assert log["loss"] == pytest.approx(loss.item(), rel=1e-3)
        assert log["samples"] == 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_script_without_ddp_reports_its_loss(inst):
    """timm's train.py in one process (no DDP module) on a GPU: its steps went out with no
    loss at all, where the same script on the CPU showed it."""
    logs, losses = _real_cuda_steps(inst, ddp=False)
    assert len(logs) == 10
    assert [log["loss"] for log in logs] == pytest.approx([v.item() for v in losses], rel=1e-3)
    assert all(log["phases"] is None for log in logs)  # no forward seen: no made-up split


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_accumulation_reports_every_micro_batch_in_its_loss(inst):
    """nanoGPT's way on one GPU, bf16: 20 micro-batches a step, each loss divided by 20 before
    its backward. The step's loss is the mean of all 20, folded on the device."""
    inst.clock = __import__("time").perf_counter
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    model = DistributedDataParallel(net.to(device), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    micro, means = 20, []
    for _ in range(3):
        undivided = []
        for _ in range(micro):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(torch.randn(32, 64, device=device)).float().pow(2).mean()
            undivided.append(loss.detach())
            (loss / micro).backward()
        opt.step()
        opt.zero_grad()
        means.append(torch.stack(undivided).mean())
    torch.cuda.synchronize()
    inst.flush(timeout=10.0)
    logs = inst.fake.logs
    assert [log["loss"] for log in logs] == pytest.approx([m.item() for m in means], rel=1e-3)


class OnGpu(torch.Tensor):
    """A loss the hooks take for a GPU's (where they read ``device``); its values stay here.
    No ``__torch_function__``: ``backward`` runs once, as a plain tensor's does."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", 0)

    def detach(self):
        return torch.Tensor.detach(self).as_subclass(OnGpu)


class FakeGpuTorch(FakeTorch):
    """FakeTorch whose pinned host memory is plain memory (no GPU here)."""

    def empty(self, *size, pin_memory=False, **kwargs):
        return torch.empty(*size, **kwargs)


def test_a_gpu_loss_without_ddp_is_read_only_once_the_device_has_passed_it(inst):
    """A script without a DDP module on a GPU (timm's train.py in one process): its steps went
    out with no loss, where the same script on the CPU showed it. Now the loss is copied to
    the host at the step's end and read once the device has passed the copy: before, reading
    it would wait for the device."""
    clock = inst.fake_clock
    done = [False]
    inst.torch = FakeGpuTorch(clock, done)
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    losses = []
    for _ in range(3):
        clock.advance(0.005)
        loss = model(torch.randn(6, 4)).pow(2).mean().as_subclass(OnGpu)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    inst.send_ready()
    assert inst.fake.logs == []  # the device has not passed the copies: nothing is read
    done[0] = True
    inst.flush()
    logs = inst.fake.logs
    assert [log["loss"] for log in logs] == pytest.approx(losses)
    assert all(log["phases"] is None for log in logs)  # no DDP forward: no made-up split
    assert [log["samples"] for log in logs] == [0, 6, 6]  # the model found at the first step


def test_a_forked_child_gets_its_own_send_lock_and_drainer(inst):
    """A DataLoader worker forked while the drainer thread held the lock must not inherit it
    held (its exit flush would wait forever)."""
    import threading

    held, done = threading.Event(), threading.Event()

    def drain_under_way():
        with inst._send_lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=drain_under_way)
    thread.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: no drainer thread, and the lock is free
            ok = inst._send_lock.acquire(timeout=1) and inst._drainer._thread is None
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_failure_in_the_drainer_thread_turns_the_hooks_off_and_says_so(inst, capsys):
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)

    def broken(now, wall, **values):
        raise RuntimeError("reporter broke")

    inst.fake.log_step_at = broken
    for _ in range(2):
        train_step(model, opt, clock)  # the second releases the first to the drainer
    assert wait_until(lambda: inst.disabled, 5)
    assert "instrumentation off after an internal error: RuntimeError: reporter broke" in (
        capsys.readouterr().err
    )


class Accelerator:
    """HF accelerate's Accelerator, as far as its logging goes: ``log`` hands the values to
    the trackers on the main process only (``on_main_process``: a no-op elsewhere), but the
    script calls it on every rank."""

    def __init__(self):
        self.logged = []

    def log(self, values, step=None, log_kwargs=None):
        self.logged.append(values)


@pytest.mark.parametrize("explicit", [False, True])
def test_accelerates_logged_accuracy_after_an_evaluation_is_the_evaluation(
    inst, monkeypatch, explicit
):
    """accelerate's complete_cv_example logs ``{"accuracy", "train_loss", "epoch"}`` after
    each evaluation pass: the run said the script reports no evaluation. A plain ``loss``
    logged each step (accelerate's nd_parallel example) is the training's, not an
    evaluation; a ``train_loss`` is never the evaluation's loss nor one of its extras."""
    fake_module(monkeypatch, "accelerate.data_loader", DataLoaderShard=DataLoaderShard)
    fake_module(monkeypatch, "accelerate.accelerator", Accelerator=Accelerator)
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))  # made by prepare: the frameworks attach
    opt = timed_sgd(model.parameters(), clock)
    accelerator = Accelerator()
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    sampler.set_epoch(1)
    if explicit:
        ddptui.log_eval(accuracy=0.5)
    for epoch_end in range(2):
        train_step(model, opt, clock)
        accelerator.log({"loss": 0.9, "lr": 0.1})  # a training step's: no evaluation
        model.eval()
        with torch.no_grad():
            model(torch.randn(3, 4))
        model.train()
        accelerator.log({"train_loss": 0.8}, step=3)  # after it, but the training's
        accelerator.log(
            {"accuracy": 58.33 + epoch_end, "train_loss": torch.tensor(0.7), "f1": 0.4, "epoch": 1}
        )
        accelerator.log({"accuracy": 1.0})  # again: once per pass
    # an evaluation's loss, by its name, without an accuracy
    model.eval()
    with torch.no_grad():
        model(torch.randn(3, 4))
    model.train()
    accelerator.log({"val_loss": 2.5, "valid_loss_aux": 3.0, "loss": 0.1})
    inst.flush()
    assert len(accelerator.logged) == 9  # every call reached accelerate
    if explicit:
        assert inst.fake.evals == [{"accuracy": 0.5}]
        return
    assert inst.fake.evals == [
        {"epoch": 1, "loss": None, "accuracy": 58.33, "f1": 0.4},
        {"epoch": 1, "loss": None, "accuracy": 59.33, "f1": 0.4},
        # its plain ``loss`` (training's) is no extra: a name of log_eval's own
        {"epoch": 1, "loss": 2.5, "accuracy": None, "valid_loss_aux": 3.0},
    ]
    instrument.uninstall()
    assert "__wrapped__" not in Accelerator.log.__dict__  # put back


def _evaluated_once(inst, tmp_path):
    """A DDP model after one training step and one evaluation pass, and a SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    train_step(model, opt, clock)
    _evaluation_pass(model)
    return model, opt, SummaryWriter(str(tmp_path))


def _evaluation_pass(model):
    model.eval()
    with torch.no_grad():
        model(torch.randn(3, 4))
    model.train()


def test_an_evaluation_logged_to_tensorboard_after_an_evaluation_pass_is_the_evaluation(
    inst, tmp_path
):
    """kubeflow's PyTorch MNIST example logs ``writer.add_scalar("accuracy", …)`` after its
    test pass (tensorboardX; torch's SummaryWriter is the same): the run said the script
    reports no evaluation. Its numbers come one a call: they are the pass's evaluation once
    training goes on (of the epoch the pass was in, though the script moved its sampler's
    on), or at the process's end; a training scalar (``loss`` each step, ``train/loss``) is
    never one."""
    from torch.utils.tensorboard import SummaryWriter

    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    writer = SummaryWriter(str(tmp_path))

    sampler.set_epoch(1)
    train_step(model, opt, clock)
    writer.add_scalar("loss", 0.9, 1)  # a training step's: no evaluation pass before it
    _evaluation_pass(model)
    writer.add_scalar("test/loss", 2.5, 1)
    writer.add_scalar("train/loss", 0.8, 1)
    writer.add_scalar(tag="accuracy", scalar_value=torch.tensor(0.25), global_step=1)
    assert inst.fake.evals == []  # not yet: more may come
    sampler.set_epoch(2)
    train_step(model, opt, clock)
    writer.add_scalar("loss", 0.7, 2)
    _evaluation_pass(model)
    writer.add_scalars("acc", {"train": 0.9, "val": 0.5}, 2)
    inst.at_exit()  # the last epoch's, at the end
    writer.close()
    evals = [{k: float(v) if v is not None else v for k, v in e.items()} for e in inst.fake.evals]
    assert evals == [
        {"epoch": 1, "loss": 2.5, "accuracy": 0.25},
        {"epoch": 2, "loss": None, "accuracy": 0.5},
    ]
    assert list(tmp_path.iterdir())  # every call reached TensorBoard


def test_a_tensorboard_scalar_is_no_second_evaluation_of_a_pass_reported_otherwise(inst, tmp_path):
    """A framework that logs to TensorBoard itself (the HF Trainer's callback, accelerate's
    tracker) reports the pass its own way: what the writer was given then is not another
    evaluation; nor is anything once the script reports its evaluations itself."""
    model, opt, writer = _evaluated_once(inst, tmp_path)
    writer.add_scalar("eval/accuracy", 0.3)
    inst._framework_eval(None, 0.3, {})  # the framework's report of the same pass
    train_step(model, opt, inst.fake_clock)
    ddptui.log_eval(accuracy=0.4)
    _evaluation_pass(model)
    writer.add_scalar("accuracy", 0.5)
    inst.at_exit()
    writer.close()
    assert [e.get("accuracy") for e in inst.fake.evals] == [0.3, 0.4]


@pytest.mark.parametrize(
    "tag, value",
    [
        ("accuracy", float("nan")),
        ("accuracy", float("inf")),
        ("accuracy", 10**400),
        ("accuracy", torch.tensor([0.1, 0.2])),
        ("accuracy", "0.5"),
        (None, 0.5),
        pytest.param("é" * 100_000 + " accuracy", 0.5, id="huge-tag"),
        ("val/loss", -1e308),
    ],
)
def test_hostile_scalars_logged_to_tensorboard_never_turn_the_hooks_off(inst, tmp_path, tag, value):
    """Whatever a script gives its SummaryWriter after an evaluation pass (a NaN, an integer
    beyond a float, text, a tensor of two, a huge tag), the hooks stay on and the step after
    it is measured; TensorBoard gets the call as it was."""
    model, opt, writer = _evaluated_once(inst, tmp_path)
    with contextlib.suppress(Exception):  # TensorBoard's own refusal, if any
        writer.add_scalar(tag, value)
    with contextlib.suppress(Exception):
        writer.add_scalars("acc", {tag: value, "val": value})
    train_step(model, opt, inst.fake_clock)
    inst.at_exit()
    writer.close()
    assert not inst.disabled
    assert len(inst.fake.evals) <= 1


class WandbRun:
    """Weights & Biases' ``Run``, as far as its logging goes (``wandb.log`` is a run's)."""

    def __init__(self):
        self.logged = []

    def log(self, data, step=None, commit=None):
        self.logged.append(data)


def test_an_evaluation_logged_to_wandb_after_an_evaluation_pass_is_the_evaluation(
    inst, monkeypatch
):
    """nanoGPT with ``wandb_log=True`` logs ``{"iter", "train/loss", "val/loss", "lr", "mfu"}``
    after its ``estimate_loss`` pass (eval mode, no grad); each step's logging before it is
    the training's. Inside an HF Trainer's evaluation (its WandbCallback) nothing is taken:
    the Trainer reports that pass itself."""
    module = types.ModuleType(instrument._WANDB)
    module.Run = WandbRun
    monkeypatch.setitem(sys.modules, instrument._WANDB, module)
    inst._attach_wandb(module)
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    run = WandbRun()
    train_step(model, opt, clock)
    run.log({"iter": 1, "train/loss": 0.9})  # no evaluation pass before it
    _evaluation_pass(model)
    run.log({"iter": 2, "train/loss": 0.8, "val/loss": 1.25, "lr": 0.1, "mfu": 3.5})
    run.log({"val/loss": 9.0})  # again: once a pass
    train_step(model, opt, clock)
    _evaluation_pass(model)
    inst._evaluating += 1  # an HF Trainer's evaluate under way
    run.log({"eval/loss": 2.0})
    inst._evaluating -= 1
    assert len(run.logged) == 4  # every call reached wandb
    assert inst.fake.evals == [
        {"epoch": None, "loss": 1.25, "accuracy": None, "iter": 2, "lr": 0.1, "mfu": 3.5}
    ]
    instrument.uninstall()
    assert "__wrapped__" not in WandbRun.__dict__["log"].__dict__  # put back


# -- MMEngine (OpenMMLab's runner), as an importable package of its own -----------------------
MMENGINE_LOOPS = """
class EpochBasedTrainLoop:
    def __init__(self, max_epochs):
        self._max_epochs = max_epochs

    @property
    def max_epochs(self):
        return self._max_epochs


class IterBasedTrainLoop:
    def __init__(self, max_iters):
        self._max_epochs = 1  # as MMEngine's: for its hooks' sake
        self._max_iters = max_iters

    @property
    def max_epochs(self):
        return self._max_epochs
"""

MMENGINE_RUNNER = """
class Runner:
    def __init__(self, train_loop, hooks):
        self._train_loop, self._hooks = train_loop, hooks

    def call_hook(self, fn_name, **kwargs):
        for hook in self._hooks:
            if hasattr(hook, fn_name):
                getattr(hook, fn_name)(self, **kwargs)
"""


@pytest.fixture
def mmengine(tmp_path, monkeypatch):
    """A package ``mmengine`` with MMEngine's runner and loops as far as the hooks go,
    imported after ddptui is installed (as a script imports it): the real import path."""
    runner = tmp_path / "mmengine" / "runner"
    runner.mkdir(parents=True)
    (tmp_path / "mmengine" / "__init__.py").write_text("")
    (runner / "__init__.py").write_text("")
    (runner / "loops.py").write_text(MMENGINE_LOOPS)
    (runner / "runner.py").write_text(MMENGINE_RUNNER)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import mmengine.runner.loops as loops
        import mmengine.runner.runner as runner_module

        yield runner_module, loops
    finally:
        for name in [n for n in sys.modules if n == "mmengine" or n.startswith("mmengine.")]:
            del sys.modules[name]


class HookSeen:
    """An MMEngine hook that keeps what it was called with."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name.startswith(("before_", "after_")):
            return lambda runner, **kwargs: self.calls.append((name, kwargs))
        raise AttributeError(name)


def _mmengine_validation(runner, model, clock, metrics, seconds=0.4):
    """MMEngine's ValLoop: the model in eval mode, each batch through the inner module (its
    ``MMDistributedDataParallel.val_step``), never a DDP forward; the metrics to the hooks."""
    runner.call_hook("before_val_epoch")
    model.eval()
    with torch.no_grad():
        model.module(torch.randn(3, 4))
    clock.advance(seconds)
    model.train()
    runner.call_hook("after_val_epoch", metrics=metrics)


def test_an_mmengine_validations_metrics_are_its_evaluation(inst, mmengine):
    """mmengine's ``examples/distributed_training.py`` (torchrun, 2 ranks, gloo) printed
    ``Epoch(val) [1][4/4] accuracy: 24.8000`` and ddptui said the script reports no
    evaluation, with epochs unknown: its DDP wrapper validates through the inner module.
    The metrics its runner hands ``after_val_epoch`` are the epoch's evaluation (mmpretrain's
    ``accuracy/top1`` the accuracy, the other numbers extras), an epoch-based loop's
    ``max_epochs`` the plan; a test loop's metrics and an iteration-based loop's 1 epoch are
    neither. Every hook still gets its call as it was."""
    runner_module, loops = mmengine
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), num_replicas=1, rank=0)
    hook = HookSeen()
    runner = runner_module.Runner(loops.EpochBasedTrainLoop(2), [hook])
    runner.call_hook("before_train")
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        runner.call_hook("before_train_iter", batch_idx=0)
        train_step(model, opt, clock)
        metrics = {"accuracy/top1": torch.tensor(24.8 + epoch), "accuracy/top5": 80.0 + epoch}
        _mmengine_validation(runner, model, clock, metrics)
    runner.call_hook("after_test_epoch", metrics={"accuracy": 99.0})  # a test: no evaluation
    runner_module.Runner(loops.IterBasedTrainLoop(40), []).call_hook(fn_name="before_train")
    inst.flush()
    evals = [{k: v if v is None else float(v) for k, v in e.items()} for e in inst.fake.evals]
    assert evals == [
        {"epoch": 0, "loss": None, "accuracy": pytest.approx(24.8), "accuracy/top5": 80.0},
        {"epoch": 1, "loss": None, "accuracy": pytest.approx(25.8), "accuracy/top5": 81.0},
    ]
    assert inst.fake.announced == [{"epochs": 2}]
    assert [name for name, _ in hook.calls] == [
        "before_train",
        *["before_train_iter", "before_val_epoch", "after_val_epoch"] * 2,
        "after_test_epoch",
    ]
    assert hook.calls[3][1] == {"metrics": {"accuracy/top1": 24.8, "accuracy/top5": 80.0}}
    ddptui.log_eval(epoch=1, accuracy=0.5)  # the script's own: MMEngine's are not reported
    _mmengine_validation(runner, model, clock, {"accuracy": 1.0})
    assert [e["accuracy"] for e in inst.fake.evals[2:]] == [0.5]
    instrument.uninstall()
    assert "__wrapped__" not in runner_module.Runner.__dict__["call_hook"].__dict__  # put back


def test_an_mmengine_validation_within_a_pass_is_the_steps_eval_phase(inst, mmengine):
    """An iteration-based MMEngine loop validates every ``val_interval`` iterations, within
    its pass over an InfiniteSampler: the validation's time was the next step's (its
    forwards no DDP forward's); it is that step's ``eval``, out of its time."""
    runner_module, loops = mmengine
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    runner = runner_module.Runner(loops.IterBasedTrainLoop(40), [])
    runner.call_hook("before_train")
    train_step(model, opt, clock)
    _mmengine_validation(runner, model, clock, {"loss": 2.5}, seconds=0.400)
    train_step(model, opt, clock)
    inst.flush()
    first, second = inst.fake.logs
    assert second["phases"]["eval"] == pytest.approx(0.010 + 0.400)  # its forward, its wait
    assert second["phases"]["data"] == pytest.approx(0.005)
    assert second["step_time"] == pytest.approx(first["step_time"] + 0.005)  # its data: no more
    assert [e["loss"] for e in inst.fake.evals] == [2.5]
    assert inst.fake.announced == []


@pytest.mark.parametrize(
    "metrics",
    [
        None,
        "accuracy",
        {"accuracy": float("nan")},
        {"accuracy": 10**400},
        {"accuracy": torch.tensor([0.1, 0.2])},
        {None: 0.5, ("a",): 0.5},
        {f"m{i}": float(i) for i in range(100_000)},
        {"é" * 100_000 + " accuracy": 0.5},
    ],
    ids=["none", "text", "nan", "huge-int", "two", "odd-keys", "many", "huge-name"],
)
def test_hostile_mmengine_metrics_never_turn_the_hooks_off(inst, mmengine, metrics):
    """Whatever a runner's hooks are handed as metrics, the hooks stay on, the step after the
    validation is measured, and at most one evaluation is reported."""
    runner_module, loops = mmengine
    clock = inst.fake_clock
    model = DistributedDataParallel(Net(clock))
    opt = timed_sgd(model.parameters(), clock)
    runner = runner_module.Runner(types.SimpleNamespace(max_epochs=3), [HookSeen()])
    runner.call_hook("before_train")
    train_step(model, opt, clock)
    _mmengine_validation(runner, model, clock, metrics)
    train_step(model, opt, clock)
    inst.flush()
    assert not inst.disabled
    assert len(inst.fake.logs) == 2
    assert len(inst.fake.evals) <= 1
    assert inst.fake.announced == []


@pytest.mark.parametrize("compiled", [False, True])
def test_a_model_trained_without_ddp_or_a_data_loader_counts_its_batches(inst, compiled):
    """karpathy/nanochat: no DDP module (its optimizer reduce-scatters the gradients), its
    batches from a generator of token tensors, no DataLoader: "samples not counted" and no
    rate for the whole run. The module its optimizer trains (``torch.compile``'s wrapper,
    which holds the model) is found at the end of the first step and its training forwards
    count from the second on; its validation in eval mode under ``no_grad`` between two steps
    counts none and is out of the next step's time (it read three times the others')."""
    clock = inst.fake_clock
    net = Net(clock)
    model = torch.nn.Module()  # as torch.compile's wrapper holds the model: _orig_mod
    model._orig_mod = net
    model.forward = net.__call__
    model = model if compiled else net
    opt = timed_sgd(net.parameters(), clock)
    ema = Net(clock)  # another model, not trained by the optimizer
    for step in range(4):
        if step == 2:
            model.eval()
            with torch.no_grad():
                for batch in range(3):
                    clock.advance(0.100 if batch else 0.0)  # its batch, made between them
                    model(torch.randn(5, 4))  # 10 ms each
            model.train()
        for _ in range(2):  # two micro-batches a step
            clock.advance(0.005)
            (model(torch.randn(3, 4)).pow(2).mean() / 2).backward()
        ema(torch.randn(7, 4))
        opt.step()
        opt.zero_grad()
    inst.flush()
    logs = inst.fake.logs
    assert [log["samples"] for log in logs] == [0, 6, 6, 6]
    # 2 x (5 + 10 + 20 ms) + the copy's 10 + the optimizer's 3; the validation's 230 ms out
    assert [log["step_time"] for log in logs[1:]] == pytest.approx([0.083] * 3)
    assert logs[1]["phases"] is None  # no split of a step no DDP forward marks


def test_a_second_optimizers_forwards_without_ddp_or_a_data_loader_are_no_samples(inst):
    """Two optimizers an iteration, no DDP module, no DataLoader (a GAN's discriminator, then
    its generator through it): the second joins the step, and the forwards of the module the
    first trains made for it count no samples, as a DDP module's do not."""
    clock = inst.fake_clock
    first, second = Net(clock), torch.nn.Linear(1, 1)
    opt_first = timed_sgd(first.parameters(), clock)
    opt_second = timed_sgd(second.parameters(), clock)
    for _ in range(3):
        first(torch.randn(4, 4)).pow(2).mean().backward()
        opt_first.step()
        opt_first.zero_grad()
        second(first(torch.randn(5, 4))).pow(2).mean().backward()  # through the first module
        opt_second.step()
        opt_second.zero_grad()
    inst.flush()
    assert [log["samples"] for log in inst.fake.logs] == [0, 4, 4]


class Mesh:
    """A device mesh as ddptui reads it: its number of ranks."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def test_a_model_sharded_over_part_of_the_world_says_its_data_parallel_ranks(inst, monkeypatch):
    """FSDP2's ``fully_shard(model, mesh=dp_mesh)`` over 2 ranks of 4 (pytorch/examples'
    ``fsdp_tp_example.py``: tensor parallel over the other dimension): the rank says once that
    its gradients are synchronized over 2 ranks, so that the run counts each batch once. A
    mesh of the whole world, or none, says nothing."""

    sharded = []

    def fully_shard(module, *, mesh=None):
        sharded.append(module)
        return module

    fsdp = types.ModuleType("fake_fsdp")
    fsdp.fully_shard = fully_shard
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    inst._follow_fully_shard(fsdp)
    try:
        fsdp.fully_shard("layer")
        fsdp.fully_shard("layer", mesh=Mesh(4))
        assert inst.fake.notes == []
        assert fsdp.fully_shard("model", mesh=Mesh(2)) == "model"
        fsdp.fully_shard("model", mesh=Mesh(2))
    finally:
        inst.detach()
    assert sharded == ["layer", "layer", "model", "model"]
    assert inst.fake.notes == [("data_parallel", {"group_size": 2})]


def test_a_tensor_parallel_split_says_the_ranks_that_train_distinct_batches(inst, monkeypatch):
    """pytorch/examples' ``tensor_parallel_example.py``: ``parallelize_module`` over a mesh of
    the whole world, every rank on the same batch: at most the world over the mesh's ranks
    are data-parallel (1 here), said once; a smaller number learned later (a DDP or FSDP
    group beside a pipeline) is said again, a larger one is not."""

    tp = types.ModuleType("fake_tp")
    tp.parallelize_module = lambda module, device_mesh=None, parallelize_plan=None: module
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 8)
    inst._follow_parallelize(tp)
    try:
        tp.parallelize_module("block", None, {})  # torch's current mesh: not read
        assert inst.fake.notes == []
        assert tp.parallelize_module("block", Mesh(2), {}) == "block"  # 8 ranks, 2 a batch
        tp.parallelize_module("block", device_mesh=Mesh(2))
        assert inst.fake.notes == [("data_parallel", {"group_size": 4})]
        inst._data_parallel(4)  # not less than said
        inst._data_parallel(2)  # the DDP group beside a pipeline of 2
    finally:
        inst.detach()
    assert inst.fake.notes == [
        ("data_parallel", {"group_size": 4}),
        ("data_parallel", {"group_size": 2}),
    ]


def test_a_training_samplers_replicas_fewer_than_the_world_say_its_data_parallel_ranks(
    inst, monkeypatch
):
    """huggingface/picotron shards its data over its data-parallel ranks only
    (``DistributedSampler(num_replicas=dp_world_size)``), its pipeline stages each drawing
    the same batches: 2 stages read 480 samples for the 240 its pipeline trained. A training
    pass over such a sampler says so once; an evaluation's (under no_grad) does not, nor a
    sampler over the whole world."""
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    clock = inst.fake_clock
    model = Net(clock)
    opt = timed_sgd(model.parameters(), clock)
    data = [torch.randn(4) for _ in range(8)]

    def loader(replicas):
        sampler = torch.utils.data.distributed.DistributedSampler(
            data, num_replicas=replicas, rank=0, shuffle=False
        )
        return torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)

    def train_on(batches):
        for x in batches:
            model(x).pow(2).mean().backward()
            opt.step()

    train_on(loader(4))  # the whole world: nothing to say
    with torch.no_grad():
        for x in loader(1):  # an evaluation's: not the training data
            model(x)
    assert inst.fake.notes == []
    train_on(loader(2))
    train_on(loader(2))
    assert inst.fake.notes == [("data_parallel", {"group_size": 2})]


def test_a_ddp_module_over_part_of_the_world_says_its_data_parallel_ranks(inst, monkeypatch):
    """A DDP module over a process group smaller than the world (its ranks' pipeline or
    tensor parallel peers outside it): the rank says the group's size once; over the whole
    world it says nothing."""
    clock = inst.fake_clock
    DistributedDataParallel(Net(clock))  # the world's group: nothing to say
    assert inst.fake.notes == []
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)  # one rank of four
    DistributedDataParallel(Net(clock))
    DistributedDataParallel(Net(clock))
    assert inst.fake.notes == [("data_parallel", {"group_size": 1})]
