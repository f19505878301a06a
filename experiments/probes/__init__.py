"""Probes: standalone measurements that decide a design or explain a gap (kernel designs,
a group's configs timed alone, generated code beside Inductor's, a kernel's registers and
spills, a step's kernels by device time, convolution layouts)."""
