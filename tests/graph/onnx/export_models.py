#!/usr/bin/env python3
"""Exports the models the ONNX tests plan (tests/graph/onnx/CMakeLists.txt).

Run with Debian's interpreter (/usr/bin/python3: torch is installed for it):
    export_models.py OUT_DIR [resnet18] [mobilenet_v3_small] [transformer] [transformer8]
Weights are random (no download): the tests plan shapes, not predictions.
Every parameter and buffer is drawn afresh, as in a trained model: with the
constructors' identical initial values (zero biases, cloned encoder layers)
the exporter would merge equal weights into one initializer shared by
several layers, which no trained model has.
Each model is written as OUT_DIR/NAME.onnx; the transformer has dynamic
batch and sequence axes named "batch" and "seq".
"""
import os
import sys
import time

import torch


def resnet18():
    import torchvision
    return torchvision.models.resnet18(weights=None), (torch.randn(1, 3, 224, 224),), None


def mobilenet_v3_small():
    import torchvision
    return torchvision.models.mobilenet_v3_small(weights=None), (torch.randn(1, 3, 224, 224),), None


class Encoder(torch.nn.Module):
    """A small transformer encoder: embedding, 4 layers, a projection."""

    def __init__(self, vocab=1000, d_model=128, heads=4, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def transformer(layers=4):
    axes = {"tokens": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    return Encoder(layers=layers), (torch.randint(0, 1000, (2, 16)),), axes


MODELS = {"resnet18": resnet18, "mobilenet_v3_small": mobilenet_v3_small,
          "transformer": transformer,
          # not exported by default: about 1,100 nodes, for bench/plan (docs/graph-plans.md)
          "transformer8": lambda: transformer(layers=8)}
DEFAULT = ["resnet18", "mobilenet_v3_small", "transformer"]


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or DEFAULT
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name in names:
        t0 = time.monotonic()
        model, args, axes = MODELS[name]()
        model.eval()
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                if t.is_floating_point():
                    t.copy_(torch.rand_like(t) * 0.1 + 0.01)
        path = os.path.join(out, name + ".onnx")
        kwargs = {}
        if axes:
            kwargs = {"input_names": list(axes)[:1], "output_names": list(axes)[1:],
                      "dynamic_axes": axes}
        torch.onnx.export(model, args, path, opset_version=14, **kwargs)
        print(f"{name}: {os.path.getsize(path)} bytes in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
