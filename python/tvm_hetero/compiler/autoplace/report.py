"""The automatic placement's explanation (the :class:`~.explanation.AutoplaceReport` :mod:`.measured`
makes), as text for the report."""

from __future__ import annotations

from .explanation import AutoplaceReport

#: A measured latency this many times off its prediction (either way) gets a note in the report.
FAR_OFF = 3.0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _how(backend: str | None) -> str:
    return "as TVM kernels" if backend in (None, "tvm") else f"with {backend}"


def explain(auto: AutoplaceReport) -> list[str]:
    """Lines: per device what it got, predicted vs measured, the alternatives, the largest choices."""
    judged = f"; {auto.as_built_measured} kernels and blocks measured to judge placements as built" \
        if auto.as_built_measured else ""
    lines = [
        (f"  automatic placement (objective {auto.objective}): {auto.kernels_measured} kernel costs measured, "
         f"{auto.kernels_cached} from the cost cache{judged}")
    ]
    if auto.unconfirmed:
        lines.append(f"    {auto.unconfirmed} times never agreed with their re-measurement (a loaded machine?): "
                     "used for this build, not kept in the cost cache")
    for row in auto.per_device:
        split = ", ".join(f"{n} {_how(v)}" for v, n in sorted(row.variants.items()))
        lines.append(
            f"    {row.device:<8} {row.kernels:4d} units ({row.ops} relax ops{'; ' + split if split else ''}), "
            f"busy {_ms(row.busy_seconds)}" + (f", {_ms(row.call_seconds)} per call into it"
                                              if row.call_seconds else "")
        )
    measured = auto.measured_seconds
    ratio = f" ({measured / auto.predicted_seconds:.2f}x predicted)" if measured and auto.predicted_seconds else ""
    again = " (kept from an earlier build of this graph)" if auto.measured_cached else ""
    built = auto.as_built
    how = f" (as built: {built.nodes} kernels and blocks, {built.blocks} blocks)" if built else ""
    lines.append(f"    latency predicted {_ms(auto.predicted_seconds)}{how}, measured {_ms(measured)}{ratio}{again}")
    if measured and auto.predicted_seconds and not 1 / FAR_OFF < measured / auto.predicted_seconds < FAR_OFF:
        lines.append("    note: measured far from predicted: other processes loading the cores, or OpenMP threads spinning "
                     "(start Python with OMP_WAIT_POLICY=PASSIVE; docs/autoplace.md, Accuracy)")
    if auto.verdict:
        lines.append(f"    judged: {auto.verdict}")
    check = auto.one_device_check
    if check is not None:
        verdict = (f"faster, so the build keeps everything on {check.device}" if check.kept_one_device
                   else "slower, so the automatic choice is kept")
        split = f"the split measured {_ms(check.split_measured_seconds)}" + (
            f" (predicted {_ms(check.split_predicted_seconds)})" if check.split_predicted_seconds else "")
        lines.append(f"    {split}; measured against all on {check.device} (its regions joined into blocks): "
                     f"{_ms(check.measured_seconds)}, {verdict}"
                     + (" (in an earlier build of this choice)" if check.cached else ""))
    if auto.measured_check_device is not None:
        lines.append(f"    an earlier build of this choice measured all on {auto.measured_check_device} faster than "
                     "the split: kept on that device")
    if auto.objective == "throughput" and auto.bottleneck_seconds:
        lines.append(f"    bottleneck {_ms(auto.bottleneck_seconds)} of one device per inference: at best "
                     f"{1.0 / auto.bottleneck_seconds:.1f} inferences/s streamed through the devices")
    if auto.split_predicted_seconds is not None:
        lines.append(
            f"    the best split found ({_ms(auto.split_predicted_seconds)}) gains less than "
            f"{auto.min_gain:.0%} over one device: kept on one device"
        )
    if auto.regions_formed is not None:
        lines.append(f"    note: {auto.regions_chosen} backend regions were chosen but {auto.regions_formed} "
                     "were formed (matching took other ops once some regions were left out): the prediction "
                     "does not cover the difference")
    for alternative in auto.alternatives:
        lines.append(f"    alternative {alternative.label}: predicted {_ms(alternative.seconds)}")
    if auto.decisions:
        lines.append("    largest single decisions:")
    for d in auto.decisions:
        lines.append(
            f"      {d.kernel} on {d.device} {_how(d.backend)}: {_ms(d.seconds)}, "
            f"vs {_ms(d.other_seconds)} {_how(d.other_backend)} on {d.other_device}"
        )
    return lines
