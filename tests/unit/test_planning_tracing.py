"""Profiles of factory-built PyTorch models, traced on the meta device."""

import textwrap

import pytest
from shoal.errors import ValidationError
from shoal.planning.tracing import load_factory, main_stack, profile_factory

torch = pytest.importorskip("torch")
nn = torch.nn

MLP = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.up = nn.Linear(h, 4 * h)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self, d_in=16, h=64, d_out=10, n=4):
        super().__init__()
        self.inp = nn.Linear(d_in, h)
        self.blocks = nn.ModuleList([Block(h) for _ in range(n)])
        self.out = nn.Linear(h, d_out)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build():
    return Net()
"""


def write(tmp_path, source, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def cpu_model(path):
    return load_factory(f"{path}:build")()  # built normally, weights allocated on the CPU


@pytest.fixture
def mlp(tmp_path):
    return write(tmp_path, MLP)


def test_the_stack_of_blocks_becomes_the_repeated_layers(mlp):
    profile = profile_factory(f"{mlp}:build", (8, 16))
    model = cpu_model(mlp)
    blocks = [layer for layer in profile.layers if layer.repeated]
    assert len(blocks) == profile.blocks == 4
    assert [layer.name for layer in profile.layers] == [
        "prologue", "block0", "block1", "block2", "block3", "epilogue"]
    block = model.blocks[0]
    for layer in blocks:
        assert layer.params == sum(p.numel() for p in block.parameters())
    assert profile.params == sum(p.numel() for p in model.parameters())
    assert profile.description["stack"] == "blocks"


def test_forward_flops_per_sample_are_two_per_weight(mlp):
    profile = profile_factory(f"{mlp}:build", (8, 16))
    model = cpu_model(mlp)
    layers = {layer.name: layer for layer in profile.layers}

    def matmul_flops(module):  # a multiply and an add per weight for one input row
        return 2 * sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))

    for i in range(4):
        assert layers[f"block{i}"].flops == matmul_flops(model.blocks[i])
    assert layers["prologue"].flops == matmul_flops(model.inp)
    assert layers["epilogue"].flops == matmul_flops(model.out)
    assert profile.flops == matmul_flops(model)


def test_saved_activations_leave_the_weights_out(mlp):
    profile = profile_factory(f"{mlp}:build", (8, 16))
    block = next(layer for layer in profile.layers if layer.repeated)
    h = 64
    # autograd keeps up's input (h), GELU's input (4h) and down's input (4h), 2 bytes each
    saved = block.act_split + block.act_kept
    assert saved == 2 * (h + 4 * h + 4 * h)
    assert saved < block.params * 2 / 50  # the weights alone would be params * 2 bytes
    assert block.boundary == 2 * h  # its output, at 16 bits


def test_tensor_parallelism_splits_what_the_linears_save_and_nothing_else(mlp):
    profile = profile_factory(f"{mlp}:build", (8, 16))
    block = next(layer for layer in profile.layers if layer.repeated)
    h = 64
    # SMP's DistributedLinear splits its input features: up's and down's inputs are split;
    # GELU's input is up's summed output, whole on every tensor-parallel rank
    assert block.act_split == 2 * (h + 4 * h)
    assert block.act_kept == 2 * 4 * h


def test_activations_and_flops_scale_with_the_sample_not_the_batch(mlp):
    one = profile_factory(f"{mlp}:build", (8, 16))
    three = profile_factory(f"{mlp}:build", (8, 3, 16))  # three rows per sample
    other_batch = profile_factory(f"{mlp}:build", (2, 3, 16))
    pairs = list(zip(one.layers, three.layers))
    for a, b in pairs:
        assert b.act_split + b.act_kept == 3 * (a.act_split + a.act_kept)
        assert b.flops == 3 * a.flops
        assert b.params == a.params
    assert [x.act_split for x in other_batch.layers] == [x.act_split for x in three.layers]
    assert other_batch.flops == three.flops


def test_the_main_stack_is_the_one_holding_most_parameters():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(8, 8) for _ in range(6)])  # more blocks
            self.body = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))  # more parameters
            self.mixed = nn.ModuleList([nn.Linear(256, 256), nn.ReLU()])  # not one class

    model = Net()
    name, children = main_stack(model)
    assert name == "body"
    assert children == list(model.body.children())
    assert main_stack(nn.Linear(4, 4)) is None


def test_a_model_without_a_stack_is_one_layer(tmp_path):
    path = write(tmp_path, """
        from torch import nn
        def build():
            return nn.Linear(16, 32)
        """)
    profile = profile_factory(f"{path}:build", (4, 16))
    assert len(profile.layers) == 1 and profile.blocks == 0
    assert profile.params == 16 * 32 + 32
    assert profile.flops == 2 * 16 * 32


def test_a_model_starting_with_an_embedding_gets_token_ids(tmp_path):
    path = write(tmp_path, """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(100, 32)
                self.blocks = nn.ModuleList([nn.Linear(32, 32) for _ in range(2)])

            def forward(self, ids):
                if ids.dtype != torch.int64:
                    raise TypeError(f"token ids must be int64, got {ids.dtype}")
                x = self.embed(ids)
                for block in self.blocks:
                    x = block(x)
                return x

        def build():
            return Net()
        """)
    profile = profile_factory(f"{path}:build", (4, 10))
    assert profile.blocks == 2
    assert profile.params == 100 * 32 + 2 * (32 * 32 + 32)
    # ten tokens per sample through each 32 x 32 block
    assert [x.flops for x in profile.layers if x.repeated] == [2 * 10 * 32 * 32] * 2


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValidationError, match="does not exist"):
        load_factory(f"{tmp_path / 'absent.py'}:build")


@pytest.mark.parametrize("spec", ["model.py", "model:build", "model.py:", "model.py:not-a-name"])
def test_a_spec_must_be_file_colon_function(spec):
    with pytest.raises(ValidationError, match=r"must be written file\.py:function"):
        load_factory(spec)


def test_a_missing_function_is_named(mlp):
    with pytest.raises(ValidationError, match="has no function 'make'"):
        load_factory(f"{mlp}:make")


def test_a_factory_must_return_a_module(tmp_path):
    path = write(tmp_path, """
        def build():
            return {"layers": 2}
        """)
    with pytest.raises(ValidationError, match="returned dict, not an nn.Module"):
        profile_factory(f"{path}:build", (4, 16))


def test_a_forward_that_refuses_the_sample_names_its_shape(mlp):
    with pytest.raises(ValidationError, match=r"shape \(8, 17\) failed"):
        profile_factory(f"{mlp}:build", (8, 17))


@pytest.mark.parametrize("shape", [(), (8, 0)])
def test_a_sample_shape_must_be_positive(mlp, shape):
    with pytest.raises(ValidationError, match="must be positive integers"):
        profile_factory(f"{mlp}:build", shape)


def test_each_layer_counts_the_operations_its_forward_dispatches(mlp):
    """What a layer costs the host per pass: a block's two linears (a transpose and a fused
    multiply-add each), its activation and its residual add; a module call is the unit."""
    from shoal.planning.models import LINEAR_OPS

    layers = {layer.name: layer for layer in profile_factory(f"{mlp}:build", (8, 16)).layers}
    assert LINEAR_OPS == 2
    assert layers["prologue"].ops == layers["epilogue"].ops == LINEAR_OPS
    for i in range(4):
        assert layers[f"block{i}"].ops == 2 * LINEAR_OPS + 2
        assert layers[f"block{i}"].calls == 3.0
    assert layers["prologue"].calls == 1.0


GPT = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.wte = nn.Embedding(1000, 64)
        self.head = nn.Linear(64, 1000, bias=False)  # defined before the blocks, runs last
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
            for _ in range(4))
        self.norm = nn.LayerNorm(64)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, ids):
        x = self.wte(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(self.norm(x))


def untied():
    return Net(False)


def tied():
    return Net(True)
"""


def test_parameters_outside_the_blocks_go_where_their_module_runs(tmp_path):
    """SMP's auto-partition puts a language model's head with the last blocks, wherever it
    was defined; a weight the head shares with the embedding stays with the embedding."""
    path = write(tmp_path, GPT)
    untied = profile_factory(f"{path}:untied", (2, 16))
    first, last = untied.layers[0], untied.layers[-1]
    assert (first.name, first.params) == ("prologue", 1000 * 64)
    assert (last.name, last.params) == ("epilogue", 1000 * 64 + 2 * 64)  # head and norm
    tied = profile_factory(f"{path}:tied", (2, 16))
    assert tied.layers[0].params == 1000 * 64
    assert tied.layers[-1].params == 2 * 64
    assert tied.params == untied.params - 1000 * 64


def test_each_layer_counts_its_modules_and_their_outputs(tmp_path):
    """What SMP's auto-partition weighs: the modules in a layer and every one's output."""
    profile = profile_factory(f"{write(tmp_path, GPT)}:untied", (2, 16))
    block = profile.layers[1]
    assert block.modules == 5  # the Sequential and its four
    # 16 tokens: norm, linear and Sequential 64 wide, linear and GELU 256, at 2 bytes
    assert block.outputs == 16 * 2 * (3 * 64 + 2 * 256)
    # the embedding's 64; after the blocks the norm's 64 and the head's logits (the model's
    # own output is the head's, not counted twice)
    assert profile.layers[0].outputs == 16 * 2 * 64
    assert profile.layers[-1].outputs == 16 * 2 * (64 + 1000)
    assert (profile.layers[0].modules, profile.layers[-1].modules) == (2, 2)
