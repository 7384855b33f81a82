"""An HLO module as a jax function: TF's module (compiled by jaxlib, the reference) and the
stitched module (exported for TF's ``XlaCallModule``). The module's StableHLO is merged into
the caller and its main called. Imported at interpreter start with tf_hooks, so jax is
imported only inside the functions (tf_hooks/__init__.py)."""
from __future__ import annotations

import functools


def numpy_dtype(hlo_dtype: str):
    from fusionstitching.hlo.ir import NUMPY_DTYPES

    return NUMPY_DTYPES[hlo_dtype]


def module_avals(module) -> tuple[list, tuple]:
    """(one ``jax.ShapeDtypeStruct`` per parameter, one ``ShapedArray`` per flat result) of a
    parsed module."""
    import jax

    root = module.entry.root.shape
    out_avals = tuple(jax.core.ShapedArray(s.dims, numpy_dtype(s.dtype))
                      for s in (root.tuple_shapes if root.is_tuple else (root,)))
    in_avals = [jax.ShapeDtypeStruct(p.shape.dims, numpy_dtype(p.shape.dtype))
                for p in module.entry.parameters]
    return in_avals, out_avals


def hlo_function(hlo_text: str, out_avals: tuple):
    """A jax function of the flat parameters returning the flat results.

    Call it, and trace, compile and run what it returns, inside ``jax.enable_x64(True)``:
    TF's int64 values (Keras's iteration counter) must keep their type through the module."""
    from jax._src.lib import xla_client as xc

    from fusionstitching.capture import _route_around_copies

    proto = xc.hlo.hlo_module_from_text(_route_around_copies(hlo_text))
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto.as_serialized_hlo_module_proto())
    primitive = _hlo_primitive()

    def run(*params):
        return primitive.bind(*params, module=stablehlo, out_avals=out_avals)

    return run


@functools.cache
def _hlo_primitive():
    """A jax primitive that runs a StableHLO module (params ``module``: its bytecode,
    ``out_avals``): lowered by merging the module into the caller and calling its main."""
    from jax._src import dispatch
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import func
    from jax.extend.core import Primitive

    primitive = Primitive("fusionstitching_tf_module")
    primitive.multiple_results = True
    primitive.def_impl(functools.partial(dispatch.apply_primitive, primitive))
    primitive.def_abstract_eval(lambda *avals, module, out_avals: out_avals)

    def lowering(ctx, *args, module, out_avals):
        callee = mlir.merge_mlir_modules(ctx.module_context.module, "tf_module",
                                         ir.Module.parse(module),
                                         dst_symtab=ctx.module_context.symbol_table)
        types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
        return func.CallOp(types, ir.FlatSymbolRefAttr.get(callee), list(args)).results

    mlir.register_lowering(primitive, lowering)
    return primitive
