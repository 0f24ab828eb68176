"""examples/torch/fmnist_pipeline.py, except that worker 1's first run (the
second stage) dies in the middle of a step, its 40th micro-batch's
backward pass, as a process killed there would: the launcher must restart
it, the restarted script take stage 1 again, and the first stage's step
be tried again on it (test_torch_launch.py)."""

import os
import runpy

import strata.torch

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch",
                       "fmnist_pipeline.py")
marker = os.path.join(os.path.dirname(os.environ["STRATA_CONFIG"]), "stage-died-once")
if os.environ["STRATA_INDEX"] == "1" and not os.path.exists(marker):
    backward = strata.torch._Stage.backward
    calls = [0]

    def dying(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 40:
            open(marker, "w").close()
            print("stage 1 dies mid-step", flush=True)
            os._exit(3)
        return backward(self, *args, **kwargs)

    strata.torch._Stage.backward = dying
runpy.run_path(EXAMPLE, run_name="__main__")
