"""spank_berth.so end to end under a real slurmctld/slurmd (spank/tests/e2e.sh):
flags refused before submission; on the node the runtime contract (import,
create, start --detach, edf show --spank), tasks joining the container,
workdir, env merge, mounts, PMIx dir, named containers, entrypoints, save,
--environment (overrides, sbatch/salloc resolving once), teardown. Twice:
with spank/tests/fake-berth playing the runtime (the contract alone), and
with the real runtime. About 2 min each with bspk/slurm:bookworm built."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent.parent / "spank" / "tests" / "e2e.sh"


def _docker_ready():
    if not shutil.which("docker"):
        return False
    probe = subprocess.run(["docker", "image", "inspect", "berth/node:bookworm"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _docker_ready(),
                    reason="needs docker and berth/node:bookworm (scripts/base-image.sh)")
@pytest.mark.parametrize("runtime", ["fake", "real"])
def test_plugin_under_real_slurm(runtime):
    # a container of its own per runtime: `pytest -n` with the default --dist
    # (test by test) may run both at once; scripts/test.sh's loadfile does not
    result = subprocess.run(["bash", str(E2E), runtime], capture_output=True, text=True,
                            timeout=900, env={**os.environ, "BSPK_CONTAINER": f"bspk-e2e-{runtime}"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert f"e2e: all checks passed ({runtime} runtime)" in result.stdout
