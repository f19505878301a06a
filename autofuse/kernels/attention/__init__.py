"""The attention kind: matmul, softmax, matmul in one flash-attention style kernel."""
