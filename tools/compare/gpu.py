"""Where the harness's tensors live and how it waits for the GPU: the two hooks a CPU-only
self-test replaces (the real run uses CUDA throughout). Read them as gpu.DEVICE and
gpu.sync() so a replacement reaches every module."""

DEVICE = "cuda"


def sync():
    import torch
    torch.cuda.synchronize()
