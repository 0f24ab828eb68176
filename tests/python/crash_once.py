"""examples/torch/fmnist_mlp.py, except that worker 0's first run raises in
its first step (mid-task), as a script with a bug in one code path would:
the launcher must restart it and the job go on (test_torch_launch.py)."""

import os
import runpy

import strata.torch

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch",
                       "fmnist_mlp.py")
marker = os.path.join(os.path.dirname(os.environ["STRATA_CONFIG"]), "crashed-once")
if os.environ["STRATA_INDEX"] == "0" and not os.path.exists(marker):
    open(marker, "w").close()

    def crash(self, *args, **kwargs):
        raise RuntimeError("a crash for the test")

    strata.torch.Job.step = crash
runpy.run_path(EXAMPLE, run_name="__main__")
