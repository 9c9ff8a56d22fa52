#!/usr/bin/env python3
"""Writes the seed corpus of the ONNX loader's fuzzer (fuzz/seeds/onnx_loader/).

Small models (a few hundred bytes each, so libFuzzer's -max_len keeps them
whole) that reach every path of the loader: dynamic and bound dimensions,
initializers inline and in typed fields, constants folded by shape inference,
a residual join, an op of another domain. Run with python3-onnx:
    fuzz/make_onnx_seeds.py fuzz/seeds/onnx_loader
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), name="seed", opset=14):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                helper.make_opsetid("com.example", 1)])
    m.ir_version = 7
    return m


def mlp():
    w1 = numpy_helper.from_array(np.ones((4, 8), np.float32), "w1")
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [8, 2], [0.5] * 16)  # typed field
    return model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["a"], name="act"),
         helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], [w1, w2], "mlp")


def conv():
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.zeros((2,), np.float32), "b")
    return model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Add", ["c", "r"], ["s"], name="residual"),
         helper.make_node("GlobalAveragePool", ["s"], ["p"], name="pool"),
         helper.make_node("Flatten", ["p"], ["y"], name="flatten")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b], "conv")


def reshape():
    return model(
        [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
         helper.make_node("Constant", [], ["two"], name="two",
                          value=numpy_helper.from_array(np.array([2], np.int64))),
         helper.make_node("Gather", ["shape", "two"], ["last"], name="last", axis=0),
         helper.make_node("Concat", ["last", "last"], ["new"], name="new", axis=0),
         helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[1, 0, 2]),
         helper.make_node("Softmax", ["t"], ["y"], name="softmax", axis=-1),
         helper.make_node("FusedThing", ["y"], ["z"], name="custom", domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["seq", "batch", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, None)], (), "reshape")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, make in [("mlp", mlp), ("conv", conv), ("reshape", reshape)]:
        with open(os.path.join(out, name + ".onnx"), "wb") as f:
            f.write(make().SerializeToString())


if __name__ == "__main__":
    main()
