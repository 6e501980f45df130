"""The notebooks execute top to bottom (nbclient, the venv's python3 kernel) and their last
cell checks the trained model's held-out accuracy."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.mpi, pytest.mark.runtime, pytest.mark.slow]
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def run_notebook(path: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, kernel_name="python3", timeout=600,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return notebook


def outputs(notebook) -> str:
    return "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []))


@pytest.mark.torch
def test_pytorch_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    text = outputs(run_notebook(NOTEBOOKS / "pytorch_data_parallel.ipynb"))
    assert "held-out accuracy" in text and "model.tar.gz" in text


@pytest.mark.tensorflow
def test_tensorflow_notebook(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    text = outputs(run_notebook(NOTEBOOKS / "tensorflow_data_parallel.ipynb"))
    assert "held-out accuracy" in text and "model.tar.gz" in text


@pytest.mark.torch
def test_pytorch_model_parallel_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    text = outputs(run_notebook(NOTEBOOKS / "pytorch_model_parallel.ipynb"))
    assert "next-token accuracy" in text and "model.tar.gz" in text
    assert "tensor x pipeline next-token accuracy" in text
    # the tensor-parallel job's own log, as the estimator streams it into the notebook
    assert "pipeline 2 x tensor 2 x data parallel 1 (2 data-parallel ranks)" in text
    assert ("tensor parallel: 9 modules distributed (DistributedEmbedding, DistributedLinear)"
            in text)
    assert "'model.pt_1_1.pt'" in text and "'model_full.pt'" in text


def test_boto3_endpoint_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    text = outputs(run_notebook(NOTEBOOKS / "boto3_endpoint.ipynb"))
    assert "Completed file://" in text and "model.tar.gz" in text
    for host in ("algo-1", "algo-2"):
        assert f"{host}: fitted slope 3.000 on 100 points" in text


@pytest.mark.torch
def test_deploy_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path))
    notebook = run_notebook(NOTEBOOKS / "deploy.ipynb")
    text = outputs(notebook)
    assert "final train:loss: 0.0" in text and "plot written: True" in text
    assert "prediction [[1.5], [0.5]]" in text and "endpoint deleted" in text
    images = [out for cell in notebook.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) == 1
