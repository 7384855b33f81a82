"""benchmarks/thunk_share.py: which of XLA:CPU's thunks are compute, and the memory-intensive
share of a traced step (a step is "memory-bound" above half)."""
import jax
import jax.numpy as jnp

from benchmarks import thunk_share

HLO = """HloModule m

%dot_computation (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %d = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add_computation (p0.1: f32[8,8], p1.1: f32[8,8]) -> f32[8,8] {
  %p0.1 = f32[8,8]{1,0} parameter(0)
  %p1.1 = f32[8,8]{1,0} parameter(1)
  ROOT %a = f32[8,8]{1,0} add(%p0.1, %p1.1)
}

ENTRY %e (x: f32[8,8], y: f32[8,8]) -> (f32[8,8], f32[8,8], f32[8,8], f32[8,8]) {
  %x = f32[8,8]{1,0} parameter(0)
  %y = f32[8,8]{1,0} parameter(1)
  %ynn_fusion = f32[8,8]{1,0} fusion(%x, %y), kind=kCustom, calls=%dot_computation
  %add_fusion = f32[8,8]{1,0} fusion(%x, %y), kind=kLoop, calls=%add_computation
  %matmul = f32[8,8]{1,0} custom-call(%x, %y), custom_call_target="__onednn$matmul"
  %other = f32[8,8]{1,0} custom-call(%x, %y), custom_call_target="fusionstitching_k0"
  ROOT %t = (f32[8,8]{1,0}, f32[8,8]{1,0}, f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%ynn_fusion, %add_fusion, %matmul, %other)
}
"""


def test_instruction_kinds():
    kinds = thunk_share.instruction_kinds(HLO)
    # the op graph's classes: a fusion holding a dot and library calls are compute
    assert kinds["ynn_fusion"] == "compute" and kinds["matmul"] == "compute"
    assert kinds["d"] == "compute" and kinds["other"] == "compute"
    assert kinds["add_fusion"] == "memory" and kinds["a"] == "memory"


def test_share_counts_thunks_only():
    kinds = {"dot.1": "compute", "add.2": "memory", "while.3": "container"}
    events = [("dot.1", 30.0), ("add.2", 10.0), ("while.3", 100.0),
              ("ThunkExecutor::Execute", 500.0), ("add.2", 20.0)]
    assert thunk_share.share_of_events(events, kinds) == 0.5
    assert thunk_share.share_of_events([("ThunkExecutor::Execute", 1.0)], kinds) is None


def test_memory_share_of_a_traced_step():
    w = jnp.ones((64, 64), jnp.float32) / 64

    def step(x):  # XLA:CPU keeps the dot (with the max) apart from the softmax's sum and divide
        h = x @ w
        e = jnp.exp(h - h.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    share = thunk_share.memory_share(jax.jit(step), (jnp.ones((64, 64), jnp.float32),), calls=5)
    assert share is not None and 0.0 < share < 1.0
