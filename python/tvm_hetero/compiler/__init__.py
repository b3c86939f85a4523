"""Compiler: from a Relax IRModule to graph JSON + kernel library + params."""
