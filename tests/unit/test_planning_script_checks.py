"""The advisor's checks of the training script's text, each pitfall as a tested check."""

from shoal.planning import advisor, script_checks

from tests.unit.test_planning_advisor import TF_SCRIPT, TORCH_SCRIPT, codes, only, pytorch, smp

# ---------------------------------------------------------------- data parallel


def test_cpu_preprocessing_in_the_script():
    finding = only(advisor.advise(pytorch(), script_text=TORCH_SCRIPT), "SHOAL-DP007")
    assert finding.severity == "warning"
    assert "DataLoader num_workers=8" in finding.message
    assert "torchvision transforms" in finding.message
    assert "competes" in finding.message
    assert "before training" in finding.fix and "GPU" in finding.fix
    assert script_checks.cpu_preprocessing(TF_SCRIPT) == ["tf.data map without num_parallel_calls"]
    parallel = "ds = tf.data.Dataset.from_tensor_slices(x).map(f, num_parallel_calls=AUTOTUNE)"
    assert script_checks.cpu_preprocessing(parallel) == []
    assert script_checks.cpu_preprocessing("DataLoader(ds, num_workers=2)") == []
    assert script_checks.cpu_preprocessing("img = cv2.imread(p)\nfrom PIL import Image") == [
        "PIL image decoding", "OpenCV decoding"]


# ---------------------------------------------------------------- model parallel


def test_drop_last_missing_in_the_script():
    script = "loader = DataLoader(ds, batch_size=32, shuffle=True)\nds2 = ds.batch(32)\n"
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP002")
    assert "DataLoader(ds, batch_size=32, shuffle=True)" in finding.message
    assert ".batch(32)" in finding.message
    assert "drop_last=True" in finding.fix and "drop_remainder=True" in finding.fix
    done = "DataLoader(ds, batch_size=32, drop_last=True)\nds.batch(32, drop_remainder=True)"
    assert "SHOAL-MP002" not in codes(advisor.advise(smp({"partitions": 2}), script_text=done))


def test_manual_partitioning_with_tied_weights():
    script = "self.decoder.weight = self.embedding.weight\n"
    est = smp({"partitions": 2, "auto_partition": False, "default_partition": 0})
    finding = only(advisor.advise(est, script_text=script), "SHOAL-MP004")
    assert finding.severity == "warning"
    assert "the script ties weights" in finding.message
    assert "same device" in finding.message
    assert "SHOAL-MP004" not in codes(advisor.advise(smp({"partitions": 2})))


def test_sharding_by_rank_instead_of_dp_rank():
    script = "ds = ds.shard(smp.size(), smp.rank())\n"
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP005")
    assert "smp.dp_rank()" in finding.fix
    assert "SHOAL-MP005" in codes(advisor.advise(smp({"partitions": 2}),
                                                 script_text="torch.manual_seed(smp.rank())"))
    good = "ds = ds.shard(smp.dp_size(), smp.dp_rank())\n"
    assert "SHOAL-MP005" not in codes(advisor.advise(smp({"partitions": 2}), script_text=good))


def test_step_with_more_inputs_needs_non_split_inputs():
    script = "@smp.step\ndef train_step(model, data, target, scale):\n    pass\n"
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP006")
    assert "['data', 'target', 'scale']" in finding.message
    assert "non_split_inputs" in finding.fix
    named = ("@smp.step(non_split_inputs=['scale'])\n"
             "def train_step(model, data, target, scale):\n    pass\n")
    assert "SHOAL-MP006" not in codes(advisor.advise(smp({"partitions": 2}), script_text=named))
    plain = "@smp.step\ndef train_step(model, data, target):\n    pass\n"
    assert "SHOAL-MP006" not in codes(advisor.advise(smp({"partitions": 2}), script_text=plain))
    other = "@tf.function\ndef train_step(model, data, target, scale):\n    pass\n"
    assert "SHOAL-MP006" not in codes(advisor.advise(smp({"partitions": 2}), script_text=other))


def test_forward_returning_intermediate_tensors():
    script = ("class Net(nn.Module):\n    def forward(self, x):\n        h = self.a(x)\n"
              "        return self.b(h), h\n\nmodel = smp.DistributedModel(Net())\n")
    finding = only(advisor.advise(smp({"partitions": 2}), script_text=script), "SHOAL-MP007")
    assert "broadcast to all ranks" in finding.message
    assert "forward() of ['Net']" in finding.message
    for one in ("return self.b(h)", "return F.softmax(self.b(h), dim=1)"):
        single = script.replace("return self.b(h), h", one)
        assert script_checks.forwards_returning_several(single) == []
    assert "SHOAL-MP007" not in codes(advisor.advise(smp({"partitions": 2}), script_text=single))


def test_script_checks_read_the_syntax_not_the_text():
    assert script_checks.batches_keeping_the_last(
        "a = DataLoader(ds, drop_last=False)\nb = DataLoader(ds, **opts)\n"
        "c = torch.utils.data.DataLoader(ds, batch_size=4, drop_last=True)\n"
        "# DataLoader(ds) in a comment\n") == ["DataLoader(ds, drop_last=False)"]
    assert script_checks.shards_by_rank(
        "sampler = DistributedSampler(ds, num_replicas=smp.dp_size(), rank=smp.rank())\n"
        "print(smp.rank())\n") == [
        "DistributedSampler(ds, num_replicas=smp.dp_size(), rank=smp.rank())"]
    # a script that does not parse gives no script findings rather than guesses
    broken = "def forward(self, x):\n    return a, b\nDataLoader(ds\n"
    findings = advisor.advise(smp({"partitions": 2}), script_text=broken + "DistributedModel")
    assert [c for c in codes(findings) if c in ("SHOAL-MP002", "SHOAL-MP007")] == []
