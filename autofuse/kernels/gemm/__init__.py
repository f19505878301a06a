"""The GEMM kinds: a matmul with its prologue and epilogue (``kind``, rendered by ``template``)
and the row GEMM (a matmul whose rows a reduction reads whole, ``row``)."""
