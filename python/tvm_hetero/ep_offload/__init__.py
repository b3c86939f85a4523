"""Accelerators reached through a vendor SDK behind an ONNX Runtime execution provider.

This is the generic path every such accelerator takes; a vendor package (the first is listed in
:data:`tvm_hetero.devices.VENDOR_PACKAGES`) supplies only its device-kind record, a backend subclass and an *SDK module*
(:mod:`.sdk` states the functions it must have). Data flow, build to run:

1. :mod:`.backend` asks the vendor which ops it takes, op by op, each built alone as an ONNX model
   and run against ONNX Runtime's CPU EP in a child process (:mod:`.capability_probe`); regions of
   accepted ops are exported to ONNX (:mod:`.onnx_regions`) and finalized by the vendor at build.
   Before asking, the graph is prepared as ONNX Runtime prepares one for its EPs
   (:mod:`.constant_chains`, :mod:`.copy_per_reader`), then by the vendor's own passes.
2. :mod:`.verified_build` runs the built artifact once with every region checked against the CPU
   (:mod:`.region_runner`) and moves what the vendor computes wrongly back to the host; automatic
   placement (:mod:`.auto_placement`, :mod:`.host_timing`) weighs each region's call against the host.
3. At run time the kernel library's region module (src/backends/onnx_ep/) asks
   :mod:`.region_runner` for each region's function; with ``process="separate"`` every vendor call
   runs in a child process of its own (:mod:`.vendor_process`), where a crash is an error.
4. :mod:`.report` turns the build's findings into the report's lines.

Nothing here names a vendor: a second one reuses all of it (docs/new-accelerator.md).
"""
