"""A small CNN as an nn.Sequential in model.stages stages, its tables
declared by the script (model.type script), for test_torch_pipeline.py:
with 3 stages the first boundary carries 4-d activations (16 x 24 x 24 a
record). STRATA_TEST_RAISE_ONCE=1: the last stage's loss raises once, at
its 10th micro-batch, and a later stage's begin_step once, at its 5th
step (bugs in a stage's code that do not recur).
STRATA_TEST_STAGE_DEVICE=cpu: the stage computes on a copy of its modules
(job.pipeline(device=...), the CUDA path's copies, on the CPU)."""

import os

import torch

import strata.torch as st
from strata.data import read_idx_pair


def main():
    torch.set_num_threads(1)
    config = st.config()
    data = config["data"]
    x, y = read_idx_pair(data["train_images"], data["train_labels"])
    x = torch.from_numpy(x.reshape(len(x), 1, 28, 28))
    y = torch.from_numpy(y)
    job = st.init()
    torch.manual_seed(0)  # (worker 0's values are the tables' initial ones)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 22 * 22, 10))
    loss = torch.nn.functional.cross_entropy
    if os.environ.get("STRATA_TEST_RAISE_ONCE"):
        calls = [0]

        def loss(out, labels):
            calls[0] += 1
            if calls[0] == 10:
                raise RuntimeError("a bug in the last stage's loss")
            return torch.nn.functional.cross_entropy(out, labels)

        begin, begun = st._Stage.begin_step, [0]

        def begin_step(self):
            begun[0] += 1
            if begun[0] == 5 and os.environ["STRATA_INDEX"] != "0":
                raise RuntimeError("a bug in a stage's begin_step")
            return begin(self)

        st._Stage.begin_step = begin_step
    pipe = job.pipeline(model, loss=loss, input_shape=(1, 28, 28),
                        device=os.environ.get("STRATA_TEST_STAGE_DEVICE"))
    for records in job.tasks():
        for b in range(0, len(records), job.batch_size):
            idx = records[b:b + job.batch_size]
            pipe.step(x[idx], y[idx])
    if not job.evaluating:
        job.finish()
        return
    tx, ty = read_idx_pair(data["test_images"], data["test_labels"])
    tx = torch.from_numpy(tx[:2000].reshape(-1, 1, 28, 28))
    ty = torch.from_numpy(ty[:2000])
    with torch.no_grad():
        out = model(tx)
    acc = float((out.argmax(1) == ty).float().mean())
    job.finish(metrics={"test_accuracy": acc, "test_examples": len(ty),
                        "test_loss": float(torch.nn.functional.cross_entropy(out, ty))})


if __name__ == "__main__":
    main()
