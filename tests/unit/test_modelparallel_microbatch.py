"""shoal.modelparallel.torch.microbatch: an smp.step call's arguments split, its outputs gathered."""

import argparse
import collections
import warnings

import pytest
import torch
from shoal.modelparallel.torch import microbatch as mb
from shoal.modelparallel.torch.microbatch import (
    LargeOutputWarning,
    StepOutput,
    convert_outputs,
    output_bytes,
    split_arguments,
    warn_if_large,
)

Pair = collections.namedtuple("Pair", ["inputs", "labels"])


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts as a process that has given no warning yet."""
    monkeypatch.setattr(mb, "_warned", set())


def step(model, x, y):
    return model, x, y


def shares_storage(view, base):
    return view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


# --- splitting -------------------------------------------------------------------------

def test_tensors_split_like_torch_chunk_and_are_views():
    model, x, y = torch.nn.Linear(3, 2), torch.randn(8, 3), torch.arange(8)
    calls = split_arguments(step, (model, x), {"y": y}, 4)
    assert len(calls) == 4
    for k, (args, kwargs) in enumerate(calls):
        assert kwargs == {}
        assert args[0] is model
        assert torch.equal(args[1], torch.chunk(x, 4)[k])
        assert torch.equal(args[2], y[2 * k:2 * k + 2])
        assert args[1]._base is x and shares_storage(args[1], x)
    x_view = calls[1][0][1]
    x_view[0, 0] = 100.0
    assert x[2, 0] == 100.0


def test_nested_structures_are_split_and_keep_their_types():
    def f(batch):
        return batch

    a, b, c = torch.arange(6), torch.arange(12).view(6, 2), torch.arange(6) * 10
    batch = {"pair": Pair(a, [b, "tag"]), "extra": (c, 7), "od": collections.OrderedDict(z=a)}
    calls = split_arguments(f, (batch,), {}, 3)
    for k, (args, _) in enumerate(calls):
        part = args[0]
        assert type(part) is dict and list(part) == ["pair", "extra", "od"]
        assert type(part["pair"]) is Pair
        assert torch.equal(part["pair"].inputs, torch.chunk(a, 3)[k])
        assert torch.equal(part["pair"].labels[0], torch.chunk(b, 3)[k])
        assert part["pair"].labels[1] == "tag"
        assert type(part["extra"]) is tuple and part["extra"][1] == 7
        assert torch.equal(part["extra"][0], torch.chunk(c, 3)[k])
        assert type(part["od"]) is collections.OrderedDict
        assert torch.equal(part["od"]["z"], torch.chunk(a, 3)[k])


def test_defaultdict_keeps_its_type_and_factory():
    def f(batch):
        return batch

    batch = collections.defaultdict(int, x=torch.arange(4))
    parts = [args[0] for args, _ in split_arguments(f, (batch,), {}, 2)]
    assert all(type(p) is collections.defaultdict and p.default_factory is int for p in parts)
    assert torch.equal(parts[1]["x"], torch.tensor([2, 3]))


def test_set_elements_are_split_each_on_its_own():
    def f(items):
        return items

    a, b = torch.arange(4), torch.arange(4) + 10
    parts = [args[0] for args, _ in split_arguments(f, ({a, b},), {}, 2)]
    assert all(type(p) is set and len(p) == 2 for p in parts)
    assert sorted(t.tolist() for t in parts[1]) == [[2, 3], [12, 13]]


def test_containers_without_tensors_are_the_same_object():
    def f(cfg, names, shape):
        return cfg

    cfg, names, shape = {"lr": 0.1, "n": [1, 2]}, ["a", "b"], torch.Size([2, 3])
    for args, _ in split_arguments(f, (cfg, names, shape), {}, 4):
        assert args[0] is cfg and args[1] is names and args[2] is shape


def test_non_tensors_pass_through_as_the_same_object():
    def f(model, x, n, s, device, ns, nothing, opt_model):
        return x

    model = torch.nn.Linear(2, 2)
    extras = (3, "text", torch.device("cpu"), argparse.Namespace(lr=1), None, torch.nn.Sequential())
    calls = split_arguments(f, (model, torch.zeros(4, 2), *extras), {}, 2)
    for args, _ in calls:
        assert args[0] is model
        assert all(got is want for got, want in zip(args[2:], extras))


def test_non_split_inputs_pass_whole():
    def f(x, mask, scale):
        return x

    x, mask, scale = torch.zeros(4, 2), torch.ones(3, 3), torch.tensor(2.0)
    for args, _ in split_arguments(f, (x, mask, scale), {}, 2, non_split_inputs=["mask", "scale"]):
        assert args[1] is mask and args[2] is scale
        assert args[0].shape == (2, 2)


def test_non_split_inputs_accepts_one_bare_name():
    def f(x, scale):
        return x

    scale = torch.tensor(1.0)
    calls = split_arguments(f, (torch.zeros(2),), {"scale": scale}, 2, non_split_inputs="scale")
    assert all(call[0][1] is scale for call in calls)


def test_input_split_axes_apply_to_every_tensor_inside_the_argument():
    def f(seq, other):
        return seq

    seq = {"a": torch.arange(24).view(2, 6, 2), "b": [torch.arange(12).view(2, 6)]}
    other = torch.arange(6)
    calls = split_arguments(f, (seq, other), {}, 3, input_split_axes={"seq": 1})
    for k, (args, _) in enumerate(calls):
        assert torch.equal(args[0]["a"], torch.chunk(seq["a"], 3, dim=1)[k])
        assert torch.equal(args[0]["b"][0], torch.chunk(seq["b"][0], 3, dim=1)[k])
        assert torch.equal(args[1], torch.chunk(other, 3)[k])  # the others keep axis 0
    # axis 0 of 'seq' (2) is not checked against 3: only its split axis is
    with pytest.raises(ValueError, match="Argument 'other'"):
        split_arguments(f, (seq, torch.arange(4)), {}, 3, input_split_axes={"seq": 1})
    other = torch.arange(4)
    calls = split_arguments(f, (seq, other), {}, 2, input_split_axes={"seq": -2})
    assert torch.equal(calls[1][0][0]["a"], seq["a"][:, 3:])
    assert torch.equal(calls[1][0][1], other[2:])


class Sliceable:
    def __init__(self, rows):
        self.rows = rows
        self.calls = []

    def smp_slice(self, num_mb, mb, axis):
        self.calls.append((num_mb, mb, axis))
        size = len(self.rows) // num_mb
        return ("slice", self.rows[mb * size:(mb + 1) * size], axis)


def test_smp_slice_objects_are_replaced_by_their_slices():
    def f(data, nested):
        return data

    data, inner = Sliceable(list(range(6))), Sliceable([10, 11, 12])
    calls = split_arguments(f, (data, [inner]), {}, 3, input_split_axes={"nested": 2})
    assert data.calls == [(3, 0, 0), (3, 1, 0), (3, 2, 0)]
    assert inner.calls == [(3, 0, 2), (3, 1, 2), (3, 2, 2)]
    assert calls[1][0] == (("slice", [2, 3], 0), [("slice", [11], 2)])


def test_a_class_with_smp_slice_passes_through():
    def f(cls):
        return cls

    assert all(call[0][0] is Sliceable for call in split_arguments(f, (Sliceable,), {}, 2))


def test_var_positional_and_var_keyword_arguments():
    def f(model, *tensors, scale=1, **extra):
        return model

    model, a, b = object(), torch.arange(4), torch.arange(8).view(4, 2)
    mask, whole = torch.arange(4), torch.ones(5)
    calls = split_arguments(f, (model, a, b), {"scale": 3, "mask": mask, "whole": whole}, 2,
                            non_split_inputs=["whole"])
    args, kwargs = calls[1]
    assert args[0] is model and len(args) == 3
    assert torch.equal(args[1], a[2:]) and torch.equal(args[2], b[2:])
    assert kwargs["scale"] == 3 and kwargs["whole"] is whole
    assert torch.equal(kwargs["mask"], mask[2:])
    # a name of the *args parameter covers every argument it collects
    calls = split_arguments(f, (model, torch.ones(3)), {}, 2, non_split_inputs=["tensors"])
    assert calls[0][0][1].shape == (3,)


def test_keyword_call_is_accepted_and_defaults_untouched():
    def f(x, y=None):
        return x

    calls = split_arguments(f, (), {"x": torch.arange(4)}, 2)
    args, kwargs = calls[0]
    assert torch.equal(args[0] if args else kwargs["x"], torch.tensor([0, 1]))
    assert "y" not in kwargs and len(args) <= 1


def test_one_microbatch_passes_everything_through():
    def f(x, batch):
        return x

    x, batch = torch.randn(5, 2), {"ids": torch.arange(3)}
    ((args, _),) = split_arguments(f, (x, batch), {}, 1)
    assert args[0] is x and args[1] is batch


def test_a_wrong_call_raises_typeerror_like_the_function_would():
    with pytest.raises(TypeError):
        split_arguments(step, (1,), {}, 2)


# --- errors ----------------------------------------------------------------------------

def test_non_divisible_batch_gives_smps_message_with_the_argument_name():
    def f(model, x):
        return x

    with pytest.raises(ValueError) as info:
        split_arguments(f, (None, torch.zeros(10, 3)), {}, 4)
    message = str(info.value)
    assert message.startswith("Argument 'x' (shape [10, 3]): Batch size must be divisible by the "
                              "number of microbatches. Found batch size=10, number of microbatches=4.")
    assert "drop_last=True in your DataLoader" in message
    assert "'non_split_inputs'" in message and "'input_split_axis'" in message
    assert type(info.value) is ValueError  # a plain ValueError, as in SMP


def test_divisibility_error_names_the_nested_position():
    def f(batch):
        return batch

    with pytest.raises(ValueError, match=r"Argument 'batch\['ids'\]\[1\]' \(shape \[3\]\)"):
        split_arguments(f, ({"ids": [torch.zeros(4), torch.zeros(3)]},), {}, 2)


def test_divisibility_still_checked_with_one_microbatch_along_a_bad_axis():
    def f(x):
        return x

    with pytest.raises(ValueError, match="out of range"):
        split_arguments(f, (torch.zeros(4),), {}, 1, input_split_axes={"x": 1})


def test_zero_dim_tensor_must_be_listed_in_non_split_inputs():
    def f(x, scale):
        return x

    with pytest.raises(ValueError, match=r"Argument 'scale' is a 0-dim tensor.*'scale' in the "
                                         r"'non_split_inputs'"):
        split_arguments(f, (torch.zeros(4), torch.tensor(2.0)), {}, 2)
    with pytest.raises(ValueError, match="0-dim"):  # also for one microbatch
        split_arguments(f, (torch.zeros(4), torch.tensor(2.0)), {}, 1)


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match=r"\['mask'\].*not parameters of the smp.step function step"):
        split_arguments(step, (None, torch.zeros(2), torch.zeros(2)), {}, 2, non_split_inputs=["mask"])
    with pytest.raises(ValueError, match=r"\['seq', 'z'\]"):
        split_arguments(step, (None, torch.zeros(2), torch.zeros(2)), {}, 1,
                        non_split_inputs=["z"], input_split_axes={"seq": 1})


def test_any_name_is_accepted_with_var_keyword():
    def f(x, **extra):
        return x

    assert len(split_arguments(f, (torch.zeros(2),), {}, 2, non_split_inputs=["absent"])) == 2


def test_split_axis_out_of_range_names_the_argument():
    with pytest.raises(ValueError, match=r"Argument 'x' \(shape \[4, 2\]\): split axis 2"):
        split_arguments(step, (None, torch.zeros(4, 2), torch.zeros(4)), {}, 2, input_split_axes={"x": 2})


@pytest.mark.parametrize("axis", ["1", 1.0, True])
def test_split_axis_must_be_an_int(axis):
    with pytest.raises(ValueError, match="input_split_axes\\['x'\\]"):
        split_arguments(step, (None, torch.zeros(4), torch.zeros(4)), {}, 2, input_split_axes={"x": axis})


@pytest.mark.parametrize("microbatches", [0, -1, 2.0, True])
def test_microbatches_must_be_a_positive_int(microbatches):
    with pytest.raises(ValueError, match="positive int"):
        split_arguments(step, (None, None, None), {}, microbatches)


# --- warnings about arguments ----------------------------------------------------------

def test_optimizer_and_data_arguments_warn_once_per_kind():
    def f(model, opt, sched, loader, data, sampler):
        return model

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    data = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    loader = torch.utils.data.DataLoader(data)
    sampler = torch.utils.data.SequentialSampler(data)
    with pytest.warns(UserWarning) as record:
        calls = split_arguments(f, (model, opt, sched, loader, data, sampler), {}, 2)
    messages = [str(w.message) for w in record]
    assert len(messages) == 5
    assert "Argument 'opt' of the smp.step function is a torch.optim.Optimizer (SGD)" in messages[0]
    assert "learning rate scheduler" in messages[1] and "DataLoader" in messages[2]
    assert "Dataset" in messages[3] and "Sampler" in messages[4]
    assert all(w.filename == __file__ for w in record)  # points at the caller
    assert calls[1][0][1] is opt and calls[1][0][4] is data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split_arguments(f, (model, opt, sched, loader, data, sampler), {}, 2)


def test_reduce_lr_on_plateau_counts_as_a_scheduler():
    def f(sched):
        return sched

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.warns(UserWarning, match="learning rate scheduler"):
        split_arguments(f, (torch.optim.lr_scheduler.ReduceLROnPlateau(opt),), {}, 1)


# --- StepOutput ------------------------------------------------------------------------

def outputs():
    return [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]), torch.tensor([[5.0, 9.0]])]


def test_step_output_reductions_match_torch():
    tensors = outputs()
    out = StepOutput(tensors)
    assert torch.equal(out.reduce_sum(), torch.stack(tensors).sum(0))
    assert torch.allclose(out.reduce_mean(), torch.stack(tensors).mean(0))
    assert torch.equal(out.concat(), torch.cat(tensors))
    assert torch.equal(out.merge(1), torch.cat(tensors, dim=1))
    assert torch.equal(out.stack(), torch.stack(tensors))
    assert torch.equal(out.stack(1), torch.stack(tensors, 1))


def test_step_output_of_scalar_losses():
    out = StepOutput([torch.tensor(1.0), torch.tensor(3.0)])
    assert out.reduce_mean().item() == 2.0 and out.reduce_mean().dim() == 0
    assert torch.equal(out.concat(), torch.tensor([1.0, 3.0]))
    assert repr(out) == "StepOutput(2 microbatches: [1.0, 3.0], dtype=torch.float32)"


def test_reduce_sum_of_one_output_is_a_copy():
    tensor = torch.ones(2)
    total = StepOutput([tensor]).reduce_sum()
    total += 1
    assert torch.equal(tensor, torch.ones(2))


def test_step_output_sequence_protocol_and_detach():
    tensors = [torch.ones(2, requires_grad=True) * k for k in range(3)]
    out = StepOutput(tensors)
    assert len(out) == 3 and out[1] is tensors[1] and list(out) == tensors
    assert isinstance(out[1:], StepOutput) and len(out[1:]) == 2
    detached = out.detach()
    assert isinstance(detached, StepOutput) and detached is not out
    assert not any(t.requires_grad for t in detached) and all(t.requires_grad for t in out)
    assert out.reduce_mean().requires_grad
    assert "requires_grad=True" in repr(out)
    assert repr(detached) == "StepOutput(3 microbatches of shape [2], dtype=torch.float32)"


def test_step_output_repr_of_mixed_shapes_and_empty():
    assert "shapes [[1], [2]]" in repr(StepOutput([torch.zeros(1), torch.zeros(2)]))
    assert repr(StepOutput([])) == "StepOutput([])"
    with pytest.raises(ValueError, match="no outputs"):
        StepOutput([]).reduce_mean()


# --- convert_outputs -------------------------------------------------------------------

def test_convert_outputs_of_nested_structures():
    per_mb = [
        {"loss": torch.tensor(float(k)), "pair": Pair(torch.full((2, 3), k), [k, "s"]), "t": (torch.ones(1),)}
        for k in range(3)
    ]
    result = convert_outputs(per_mb)
    assert type(result) is dict and list(result) == ["loss", "pair", "t"]
    assert isinstance(result["loss"], StepOutput) and result["loss"].reduce_mean().item() == 1.0
    assert type(result["pair"]) is Pair
    assert torch.equal(result["pair"].inputs.concat(), torch.cat([torch.full((2, 3), k) for k in range(3)]))
    assert result["pair"].labels == [[0, 1, 2], ["s", "s", "s"]]
    assert type(result["t"]) is tuple and isinstance(result["t"][0], StepOutput)


def test_convert_outputs_turns_non_tensors_into_lists_by_microbatch():
    per_mb = [(0.5, 3), (0.25, 4)]  # MNIST's test_step: loss.item(), correct count
    losses, correct = convert_outputs(per_mb)
    assert losses == [0.5, 0.25] and sum(correct) == 7


def test_convert_outputs_of_none_is_a_list_of_none():
    assert convert_outputs([None, None, None]) == [None, None, None]


def test_convert_outputs_mapping_key_order_may_differ():
    result = convert_outputs([{"a": 1, "b": 2}, {"b": 3, "a": 4}])
    assert result == {"a": [1, 4], "b": [2, 3]}


def test_convert_outputs_detach_flag():
    w = torch.ones(2, requires_grad=True)
    per_mb = [(w * k).sum() for k in range(2)]
    assert not any(t.requires_grad for t in convert_outputs(per_mb))
    kept = convert_outputs(per_mb, detach=False)
    assert all(t.requires_grad for t in kept) and kept[1] is per_mb[1]


@pytest.mark.parametrize("per_mb, message", [
    ([torch.zeros(1), 0.5], "microbatch 0 returned a tensor of shape [1] but microbatch 1 returned a float"),
    ([(torch.zeros(1), 1), (torch.zeros(1),)], "a tuple of length 2 but microbatch 1 returned a tuple of length 1"),
    ([{"a": 1}, {"b": 1}], "a dict with keys ['a'] but microbatch 1 returned a dict with keys ['b']"),
    ([[torch.zeros(1)], (torch.zeros(1),)], "a list of length 1"),
    ([(torch.zeros(1), None), (torch.zeros(1), torch.ones(1))], "at output[1], microbatch 0 returned None"),
])
def test_convert_outputs_structure_mismatch(per_mb, message):
    with pytest.raises(ValueError, match="returned different structures") as info:
        convert_outputs(per_mb)
    assert message in str(info.value)


def test_convert_outputs_needs_a_microbatch():
    with pytest.raises(ValueError):
        convert_outputs([])


# --- output size -----------------------------------------------------------------------

def test_output_bytes_counts_nested_tensors():
    value = {"a": torch.zeros(4, dtype=torch.float32), "b": [torch.zeros(2, 2, dtype=torch.float64), 3],
             "c": StepOutput([torch.zeros(3, dtype=torch.int8)] * 2), "d": "text"}
    assert output_bytes(value) == 16 + 32 + 6
    assert output_bytes(None) == 0


def test_warn_if_large_warns_once_with_the_byte_count():
    value = [torch.zeros(256), torch.zeros(256)]  # 2048 bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_large(value, threshold_bytes=2048) == 2048
    with pytest.warns(LargeOutputWarning, match="returns 2048 bytes of tensors per step") as record:
        assert warn_if_large(value, threshold_bytes=1000) == 2048
    assert record[0].filename == __file__
    assert issubclass(LargeOutputWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_large(value, threshold_bytes=1000)
