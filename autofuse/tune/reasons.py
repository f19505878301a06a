"""Why each step of a searched plan is the implementation it is, in words: the time the search
measured (or modeled) for it, which ``explain`` and the reports show beside the step."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from autofuse.plan.steps import KernelStep, LibraryStep, Plan, Step, annotated


def measured_reasons(
    plan: Plan,
    kernel_times: Mapping[str, tuple[float, str]],
    call_seconds: Callable[[int], float],
) -> Plan:
    """``plan`` with each kernel step's reason its time by the search (``kernel_times``: kernel
    name -> (seconds, measured / modeled)) and each lone-matmul library step's its call's time
    (``call_seconds(node)``); other steps keep their reasons."""

    def why(step: Step) -> str | None:
        if isinstance(step, KernelStep) and step.kernel.name in kernel_times:
            seconds, source = kernel_times[step.kernel.name]
            return f"search: {seconds * 1e6:.2f} us ({source}), its best config in the search"
        if isinstance(step, LibraryStep) and len(step.nodes) == 1:
            seconds = call_seconds(step.out)
            return f"{step.reason}; search: {seconds * 1e6:.2f} us for the call"
        return None

    return annotated(plan, why)
