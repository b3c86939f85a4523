"""Runtime: run compiled graphs and pipelines on local and remote devices (loads libtvm_hetero.so)."""
