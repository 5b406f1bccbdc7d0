"""TorchState and ObjectState as Horovod's: an attribute given a new model
or optimizer is tracked from then on, the objects given are the attributes
themselves, handlers come from a registry scripts extend, State.reset runs
before the reset callbacks, model=None is an attribute, and the sampler
keeps its indices. Without an elastic horarun, save, restore and sync are
called directly (sync is collective)."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from hora.common.elastic import State  # noqa: E402
from hora.torch.elastic import state as state_module  # noqa: E402


def small_model(value):
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def test_a_new_model_given_to_an_attribute_is_the_one_saved_and_restored():
    first = small_model(1.0)
    state = hvd.elastic.TorchState(model=first, epoch=0)
    second = small_model(7.0)
    state.model = second  # as a reset callback that rebuilds the model would
    assert state.model is second
    state.commit()
    with torch.no_grad():
        second.weight.fill_(-1.0)
    state.restore()
    assert second.weight.tolist() == [[7.0, 7.0]]
    assert first.weight.tolist() == [[1.0, 1.0]]
    with pytest.raises(TypeError, match="model is kept by ModelStateHandler"):
        state.model = "not a model"


def test_a_new_optimizer_given_to_an_attribute_is_synced(rank):
    model = small_model(1.0)
    state = hvd.elastic.TorchState(model=model, optimizer=torch.optim.SGD(model.parameters(),
                                                                          lr=0.1))
    replacement = torch.optim.SGD(model.parameters(), lr=0.5 + rank)
    state.optimizer = replacement
    state.sync()  # rank 0's learning rate everywhere
    assert replacement.param_groups[0]["lr"] == 0.5


def test_the_objects_given_are_the_attributes_and_restore_undoes_changes_in_place():
    history = [1, 2]
    model = small_model(1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, scheduler=scheduler,
                                   history=history)
    assert state.history is history and state.scheduler is scheduler
    # the scheduler still drives the optimizer of the state (not a copy of it)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5
    state.commit()
    history.append(3)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.25
    state.restore()
    assert state.history == [1, 2]
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == 0.5


def test_model_none_is_an_attribute():
    state = hvd.elastic.TorchState(model=None, optimizer=None, batch=3)
    assert state.model is None and state.optimizer is None
    state.commit()
    state.restore()
    assert state.model is None and state.batch == 3


class Counter:
    def __init__(self, value):
        self.value = value


class CounterHandler(state_module.StateHandler):
    calls = []

    def __init__(self, counter):
        super().__init__(counter)
        self.saved_value = counter.value

    def save(self):
        self.calls.append("save")
        self.saved_value = self.value.value

    def restore(self):
        self.calls.append("restore")
        self.value.value = self.saved_value

    def sync(self):
        self.calls.append("sync")
        self.value.value = hvd.broadcast_object(self.value.value, root_rank=0)


def test_handlers_registered_by_the_script_are_used(rank):
    registry = state_module.get_handler_registry()
    state_module.set_handler_registry([(Counter, CounterHandler)] + list(registry))
    try:
        counter = Counter(10 + rank)
        state = hvd.elastic.TorchState(counter=counter)
        assert isinstance(state._handlers["counter"], CounterHandler)
        state.sync()
        assert counter.value == 10
        counter.value = 20
        state.commit()
        counter.value = 30
        state.restore()
        assert counter.value == 20
        assert CounterHandler.calls[-3:] == ["sync", "save", "restore"]
        # the copy written to disk at a commit carries what the handler saved
        fresh = Counter(0)
        again = hvd.elastic.TorchState(counter=fresh)
        again.load_snapshot(state.snapshot())
        again.restore()
        assert fresh.value == 20
    finally:
        state_module.set_handler_registry(registry)
    assert state_module.get_handler_registry() is registry


def test_reset_runs_before_the_callbacks():
    calls = []

    class MyState(hvd.elastic.ObjectState):
        def reset(self):
            calls.append("reset")

    state = MyState(epoch=1)
    state.register_reset_callbacks([lambda: calls.append("callback")])
    state.on_reset()
    assert calls == ["reset", "callback"]
    assert State.reset(state) is None  # the base class's does nothing


def test_the_sampler_keeps_this_ranks_indices(rank, size):
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    indices = list(iter(sampler))
    assert sampler.indices == indices
    padded = list(range(10)) + list(range(10))[:(-10) % size]
    assert indices == padded[rank::size]
