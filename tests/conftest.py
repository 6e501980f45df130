"""Suite-wide fixtures: no test may reach real AWS."""

import os

import pytest

FAKE_REGION = "us-west-2"


def _share_botocore_loader() -> None:
    """One botocore loader per test process: botocore parses its JSON models (SageMaker's
    alone is megabytes) once per Session and shares them among that Session's clients, and
    SageMaker SDK v2 makes a loader of its own for every endpoint lookup; the tests make
    hundreds of both, which parsed the same files again each time (a second and more per
    test that builds a request)."""
    import functools

    try:
        import botocore.loaders
        import botocore.session
    except ImportError:  # a GPU machine's image runs the CUDA tests without AWS's clients
        return

    shared = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)
    botocore.loaders.create_loader = shared
    botocore.session.create_loader = shared


_share_botocore_loader()


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch, tmp_path_factory):
    """Clear every AWS_* variable and set fake credentials and a fake config."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key, raising=False)
    home = tmp_path_factory.mktemp("aws-home")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", FAKE_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# More configurations of a case that `make test` runs in others (the same code paths, another
# combination of degrees, ranks or hosts): `make test-matrix` runs them, `make test` leaves them
# out to keep CI within its time. Each line names the configurations CI keeps.
MATRIX = {
    # kept: pp2-dp1 interleaved mb1, pp4-dp1 interleaved manual, pp2-dp2 simple spread
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp2-dp1-simple-mb4-manual]",
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp4-dp1-simple-mb8-auto]",
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp2-dp2-interleaved-mb2-auto]",
    # kept: the pipeline x data checkpoint (the tensor x reduced-data one: make test-matrix)
    "tests/integration/test_modelparallel_optimizer_sharding.py::"
    "test_partial_checkpoint_resumes_bit_exact[tp2-rdp2-bf16]",
    # kept: 2 ranks on one host, 4 ranks on two simulated hosts
    "tests/integration/test_collectives_groups.py::test_groups_on_one_host[3]",
    "tests/integration/test_collectives_groups.py::test_groups_on_one_host[4]",
    # kept: 4 ranks on two simulated hosts
    "tests/integration/test_tensorflow_dataparallel.py::"
    "test_collectives_and_training_match_numpy_and_one_process[2-1]",
    # kept: the TensorFlow example on two hosts
    "tests/integration/test_examples.py::test_example_runs_locally[tensorflow-1]",
    # kept: the PyTorch and smdistributed examples on two hosts (the same scripts)
    "tests/integration/test_examples.py::test_example_runs_locally[pytorch-1]",
    "tests/integration/test_examples.py::test_example_runs_locally[smdistributed_pytorch-1]",
    # kept: pipeline x data across two hosts in the model-parallel notebook's job and on
    # the Slurm cluster's two nodes; pp2-dp2 spread placement on one host
    "tests/integration/test_modelparallel_pipeline.py::"
    "test_two_simulated_hosts_pipeline_across_hosts",
    # kept: tp2 x sdp2 without prescaling (the same sharding; the batch split differs, which
    # tp2-prescaled-step-mb2 covers under tensor parallelism)
    "tests/integration/test_modelparallel_sharded.py::"
    "test_sharded_data_parallel_matches_one_process[tp2-sdp2-prescaled]",
    # kept: tp2 x pp2 with 2 microbatches and manual partitions; auto partition elsewhere
    "tests/integration/test_modelparallel_tensor_parallel.py::"
    "test_tensor_parallel_matches_one_process[tp2-pp2-mb4-auto]",
    # kept: pp2 x dp2 optimizer-state sharding in bf16 and fp16, and in fp32 through the
    # partial-checkpoint test, which trains it before saving
    "tests/integration/test_modelparallel_optimizer_sharding.py::"
    "test_sharded_training_matches_one_process[pp2-dp2-fp32]",
    # kept: DDP on 2 and 3 ranks (and 4 across two simulated hosts in the smdistributed case)
    "tests/integration/test_torch_ddp.py::test_torch_ddp_on_shoal_matches_gloo[4]",
    # kept: FSDP's FULL_SHARD and HYBRID_SHARD (SHARD_GRAD_OP makes the same collectives)
    "tests/integration/test_torch_frameworks.py::"
    "test_trains_to_the_parameters_gloo_reaches[fsdp1:SHARD_GRAD_OP-2]",
    # kept: the 1F1B and interleaved pipeline schedules (GPipe sends the same messages)
    "tests/integration/test_torch_frameworks.py::"
    "test_trains_to_the_parameters_gloo_reaches[pipeline:GPipe-2]",
    # kept: the notebooks, which run these two examples' scripts on two hosts
    "tests/integration/test_examples.py::test_example_runs_locally[tensorflow-2]",
    "tests/integration/test_examples.py::test_example_runs_locally[pytorch-2]",
    # kept: the benchmarks' kernels, each checked against one process by the model-parallel
    # tests (tensor parallel, sharded data parallel); their scripts' quick runs here
    "tests/integration/test_benchmark_tensor_parallel.py::"
    "test_quick_run_prints_every_row_and_equal_results",
    "tests/integration/test_benchmark_sharded_data_parallel.py::"
    "test_quick_run_prints_the_row_and_equal_results",
    # kept: 2 and 3 ranks on one host, and 4 across two simulated hosts
    "tests/integration/test_torch_groups.py::test_every_group_shape_matches_gloo[4-ranks]",
    "tests/integration/test_torch_groups.py::test_object_collectives_on_shoal_groups[4-ranks]",
    # kept: the model-parallel notebook, which runs this example's pipeline 2 x data 2 job
    # on two hosts through the estimator and checks its archive's partitions
    "tests/integration/test_examples.py::"
    "test_model_parallel_example_pipeline_2_by_data_parallel_2_on_2_hosts",
    # kept: the model-parallel notebook, which runs this example's tensor 2 x pipeline 2 job
    # on two hosts through the estimator and checks its log's layout, the modules distributed
    # and the archive's whole model; the job file itself: its dry run (test_cli)
    "tests/integration/test_examples.py::"
    "test_model_parallel_example_tensor_2_by_pipeline_2_job_file",
    # kept: interleaved with 1 microbatch (pp2) and 4 (pp4, manual partition)
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp2-dp1-interleaved-mb8-auto]",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in MATRIX:
            item.add_marker(pytest.mark.matrix)
