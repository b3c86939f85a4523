"""Relax helpers that the compiler and the backends both sit on: reading constants
(:mod:`.constant_values`), small rewriting tools (:mod:`.relax_helpers`) and the build's constant
folding (:mod:`.fold_constant_ops`). It imports neither the compiler nor a backend."""
