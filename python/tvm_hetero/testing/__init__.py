"""Test harnesses shared by ``tests/python`` and ``bench/`` (ONNX node-test parity)."""
