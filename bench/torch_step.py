#!/usr/bin/python3
"""The PyTorch side of bench/step_bench.sh: ms per training step of the
same MLP (ReLU, softmax cross-entropy summed over the batch, forward and
backward, no optimizer: Strata's workers leave the update to the pservers)
on the same device, with the gradients copied to host memory as a worker
pushes them. Prints one JSON line.

  /usr/bin/python3 bench/torch_step.py --device cuda --layers 784,1024,1024,10 --batch 256
"""
import argparse
import json
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    widths = [int(w) for w in a.layers.split(",")]
    mods = []
    for i in range(len(widths) - 1):
        mods.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods).to(dev)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(a.batch, widths[0], generator=g) * 1.0).to(dev)
    y = torch.randint(0, widths[-1], (a.batch,), generator=g).to(dev)
    host = [torch.empty(q.shape, pin_memory=dev.type == "cuda") for q in model.parameters()]
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    def step():
        model.zero_grad(set_to_none=False)
        if a.precision == "bf16" and dev.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x).float(), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        for h, q in zip(host, model.parameters()):
            h.copy_(q.grad, non_blocking=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return loss.item()

    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    ms = (time.perf_counter() - t0) * 1000 / a.steps
    print(json.dumps({"device": str(dev), "torch": torch.__version__, "layers": a.layers,
                      "batch": a.batch, "ms_per_step": round(ms, 4),
                      "loss": round(loss / a.batch, 4)}))


if __name__ == "__main__":
    main()
