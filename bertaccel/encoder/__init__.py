"""The fused BERT encoder (encoder=fused): LightSeq's techniques as our Triton kernels over packed tokens."""
