"""Test harnesses shared by ``tests/python`` and ``bench/``: model fixtures (``models``), exact
oracles (``oracles``), ONNX node-test parity and torch model sets."""
