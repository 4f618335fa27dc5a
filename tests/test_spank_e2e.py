"""spank_berth.so end to end under a real slurmctld/slurmd (spank/tests/e2e.sh):
flags refused before submission; on the node the runtime contract (import,
create, start --detach, edf show --spank) driven by spank/tests/fake-berth,
tasks joining the container, workdir, env merge, mounts, PMIx dir, named
containers, save, --environment (overrides, sbatch/salloc resolving once),
teardown. About 25 s with bspk/slurm:bookworm built, 2 min the first time."""

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
def test_plugin_under_real_slurm():
    result = subprocess.run(["bash", str(E2E), "fake"], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert "e2e: all checks passed (fake runtime)" in result.stdout
