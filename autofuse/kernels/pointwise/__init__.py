"""The pointwise kind: one elementwise loop over the output domain."""
