# From the repository root (benchmarks/make_corpus.py runs exactly this):
# PYTHONPATH=. XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_text' python tests/data/dumps/tf_layernorm_cpu/script.py
from benchmarks.models import micro

layernorm = micro.tf_functions()["layernorm"]
x, gamma, beta = micro.example_inputs("layernorm", (64, 256))
print(float(layernorm(x, gamma, beta).numpy().sum()))
