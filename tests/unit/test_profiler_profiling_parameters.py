"""Framework profiling's configuration strings, as v2 writes them, parsed as data only."""

import pytest
from shoal.debugger import FrameworkProfile
from shoal.profiler import profiling_parameters as pp


def test_what_v2_writes_reads_back():
    params = FrameworkProfile().profiling_parameters
    parsed = pp.parse(params)
    assert parsed["DetailedProfilingConfig"] == {"StartStep": 5, "NumSteps": 1}
    assert parsed["PythonProfilingConfig"] == {"StartStep": 9, "NumSteps": 3,
                                               "ProfilerName": "cprofile", "cProfileTimer": "default"}
    assert set(parsed) == set(pp.METRICS)


@pytest.mark.parametrize("text", ['__import__("os").system("touch /tmp/pwned")',
                                  '{"StartStep": open("/etc/passwd").read()}', "[1, 2]", "{"])
def test_code_is_refused_never_run(text, tmp_path):
    with pytest.raises(pp.ProfilingParametersError, match="'DetailedProfilingConfig' must be a literal dict"):
        pp.parse({"DetailedProfilingConfig": text})
