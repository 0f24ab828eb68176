#!/usr/bin/python3
"""The PyTorch side of bench/step_bench.sh: ms per training step of the
same model as strata-step-bench on the same device, forward and backward,
no optimizer (Strata's workers leave the update to the pservers), the
gradients copied to host memory as a worker pushes them. Prints one JSON
line.

  mlp:        ReLU layers, softmax cross-entropy summed over the batch.
  wide_deep:  a batch's unique keys' rows (wide weight, embedding) as leaf
              tensors, gathered per field; the deep MLP over [26 embeddings,
              13 dense]; logit = deep + sum of wide weights + v . dense;
              binary cross-entropy summed.

  /usr/bin/python3 bench/torch_step.py --device cuda --layers 784,1024,1024,10 --batch 256
  /usr/bin/python3 bench/torch_step.py --model wide_deep --layers 256,128 --batch 512
"""
import argparse
import json
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp", choices=["mlp", "wide_deep"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--unique_keys", type=int, default=0)
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
    widths = [int(w) for w in a.layers.split(",") if w]
    if a.model == "wide_deep":
        fields, n_dense, dim = 26, 13, a.embedding_dim
        widths = [fields * dim + n_dense] + widths + [1]
    mods = []
    for i in range(len(widths) - 1):
        mods.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods).to(dev)
    g = torch.Generator().manual_seed(1)
    pin = dev.type == "cuda"
    leaves = list(model.parameters())
    if a.model == "mlp":
        x = (torch.randn(a.batch, widths[0], generator=g) * 1.0).to(dev)
        y = torch.randint(0, widths[-1], (a.batch,), generator=g).to(dev)
        loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

        def forward():
            return loss_fn(model(x), y)
    else:
        unique = a.unique_keys or max(1, a.batch * fields // 2)
        slot = torch.randint(0, unique, (a.batch, fields), generator=g).to(dev)
        dense = torch.randn(a.batch, n_dense, generator=g).to(dev)
        y = torch.randint(0, 2, (a.batch,), generator=g).float().to(dev)
        # The rows as a pull brings them, each step copied in from the host.
        host_wide = torch.randn(unique, generator=g).pin_memory() if pin else torch.randn(unique, generator=g)
        host_emb = torch.randn(unique, dim, generator=g)
        host_emb = host_emb.pin_memory() if pin else host_emb
        wide = torch.zeros(unique, device=dev, requires_grad=True)
        emb = torch.zeros(unique, dim, device=dev, requires_grad=True)
        v = torch.zeros(n_dense, device=dev, requires_grad=True)
        leaves += [wide, emb, v]
        loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")

        def forward():
            with torch.no_grad():
                wide.copy_(host_wide, non_blocking=True)
                emb.copy_(host_emb, non_blocking=True)
            deep_in = torch.cat([emb[slot].reshape(a.batch, fields * dim), dense], dim=1)
            z = model(deep_in).squeeze(1) + wide[slot].sum(dim=1) + dense @ v
            return loss_fn(z, y)
    host = [torch.empty(q.shape, pin_memory=pin) for q in leaves]

    def step():
        for q in leaves:  # zeroed in place: faster here than set to None
            if q.grad is not None:
                q.grad.zero_()
        if a.precision == "bf16" and dev.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = forward().float()
        else:
            loss = forward()
        loss.backward()
        for h, q in zip(host, leaves):
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
    print(json.dumps({"model": a.model, "device": str(dev), "torch": torch.__version__, "layers": a.layers,
                      "batch": a.batch, "ms_per_step": round(ms, 4),
                      "loss": round(loss / a.batch, 4)}))


if __name__ == "__main__":
    main()
