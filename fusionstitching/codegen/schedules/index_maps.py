"""Index maps of the ops that move elements: which operand element an output element reads.

Each op is computable at any index: slice, pad, concatenate, dynamic-slice and -update-slice,
gather; scatter in the *gather form* (element ``o`` is the operand's element combined, in
update-window order, with each window's element landing on ``o``) and reduce-window (the init
value combined, in row-major order of the window positions, with each operand element under
the window), positions in padding or base-dilation holes skipped, as XLA:CPU does.
`known_index` sees through iotas (a gather's or scatter's own row).
"""
from __future__ import annotations

import itertools
import math

from ...hlo.attrs import GatherDims, ScatterDims, Window, parse_literal, parse_padding, parse_slice
from ...hlo.ir import Shape
from ..errors import CodegenError, Refusal
from ..flatten import FlatOp
from ..index_expr import (Ix, Var, add, delinearize, ix, linearize, row_major, scale,
                          value_range)
from ..kernel_ir import (Accumulate, GlobalLoad, GlobalStore, Loop, SharedArray, SharedLoad,
                         SharedStore, Value)
from ..ops import REDUCIBLE, identity
from .space import ancestors

# A scatter in the gather form costs (update windows) x (output elements): this bounds the
# code and the work per element; below it the latency-evaluator (and the pipeline's cost guard
# against XLA's in-place scatter) decides.
MAX_SCATTER_WINDOWS = 1024
# Up to this many windows a scatter is straight-line code, beyond it a loop over the windows.
UNROLLED_SCATTER_WINDOWS = 32
# A reduce-window costs (window positions) x (output elements), bounded alike; XLA:CPU's own
# optimized HLO has small windows (it rewrites scans longer than 16 into two levels).
MAX_WINDOW_POSITIONS = 1024
UNROLLED_WINDOW_POSITIONS = 32


class IndexMaps:
    """The emitter's methods for the ops that move elements (a base of `Emitter`: they build
    values with its `value`, `op`, `const`, `dynamic`, ... at the index they map to)."""

    def in_range(self, position: tuple[Value, int], lo: int, hi: int):
        """pred: lo <= position < hi (s32 values)."""
        return self.op("and", "pred", self.compare(position, self.const(lo, "s32"), "GE"),
                       self.compare(position, self.const(hi, "s32"), "LT"))

    def all_of(self, preds: list) -> tuple[Value, int] | None:
        result = None
        for p in preds:
            result = p if result is None else self.op("and", "pred", result, p)
        return result

    def undilate(self, position: Ix, n: int, interior: int) -> tuple[Ix, list]:
        """The index into a dimension of ``n`` elements of ``position`` in its padded form
        (``interior`` holes after each element, padding before and after), and the predicates
        under which that position is an element rather than padding or a hole (pad, and the
        window positions of reduce-window)."""
        lo, hi = value_range(position)
        if interior == 0 and lo >= 0 and hi < n:
            return position, []
        p, valid = self.index_value(position), []
        if interior:
            step = self.const(interior + 1, "s32")
            valid.append(self.compare(self.op("remainder", "s32", p, step),
                                      self.const(0, "s32"), "EQ"))
            p = self.op("divide", "s32", p, step)
            valid.append(self.compare(self.index_value(position), self.const(0, "s32"), "GE"))
            valid.append(self.compare(p, self.const(n, "s32"), "LT"))
        else:
            valid.append(self.in_range(p, 0, n))
        return self.dynamic(p, n), valid

    def pad(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        source_shape = self.ops[op.operands[0]].shape
        source, valid = [], []
        padding = parse_padding(op.attrs.get("padding"))
        for i, n, (low, _, interior) in zip(index, source_shape.dims, padding):
            position, inside = self.undilate(add(i, -low), n, interior)
            source.append(position)
            valid += inside
        inner = self.value(op.operands[0], tuple(source))
        if not valid:
            return inner
        return self.op("select", op.shape.dtype, self.all_of(valid), inner,
                       self.value(op.operands[1], ()))

    def concatenate(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        dim = op.dimensions[0]
        offsets = list(itertools.accumulate(
            (self.ops[o].shape.dims[dim] for o in op.operands), initial=0))
        position = self.index_value(index[dim])
        result = None
        for k in reversed(range(len(op.operands))):
            n = offsets[k + 1] - offsets[k]
            local = add(index[dim], -offsets[k])
            lo, hi = value_range(local)
            local = local if 0 <= lo and hi < n else self.dynamic(
                self.index_value(local), n)
            piece = self.value(op.operands[k], index[:dim] + (local,) + index[dim + 1:])
            result = piece if result is None else self.op(
                "select", op.shape.dtype,
                self.compare(position, self.const(offsets[k + 1], "s32"), "LT"), piece, result)
        return result

    def starts(self, op: FlatOp, first: int, source: Shape, sizes: tuple[int, ...]) -> list[Ix]:
        """Clamped start per dim of a dynamic-slice/update (XLA clamps into the operand)."""
        return [self.dynamic(self.to_s32(self.value(op.operands[first + d], ())), n - s + 1)
                for d, (n, s) in enumerate(zip(source.dims, sizes))]

    def dynamic_slice(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        source = self.ops[op.operands[0]].shape
        starts = self.starts(op, 1, source, op.shape.dims)
        return self.value(op.operands[0], tuple(add(s, i) for s, i in zip(starts, index)))

    def dynamic_update_slice(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        update = self.ops[op.operands[1]].shape
        starts = self.starts(op, 2, op.shape, update.dims)
        local, inside = [], []
        for i, s, n in zip(index, starts, update.dims):
            p = self.op("subtract", "s32", self.index_value(i), self.index_value(s))
            inside.append(self.in_range(p, 0, n))
            local.append(self.dynamic(p, n))
        return self.op("select", op.shape.dtype, self.all_of(inside),
                       self.value(op.operands[1], tuple(local)),
                       self.value(op.operands[0], index))

    def gather(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        dims = GatherDims.parse(op.attrs)
        if dims.operand_batching_dims:
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"gather {op.name}: batching dims are not supported")
        source, indices = (self.ops[o].shape for o in op.operands)
        offset_dims, collapsed = dims.offset_dims, dims.collapsed_slice_dims
        start_map, sizes = dims.start_index_map, dims.slice_sizes
        vector_dim = dims.index_vector_dim
        batch = [index[d] for d in range(op.shape.rank) if d not in offset_dims]
        operand_index: list[Ix] = [ix(0)] * source.rank
        for k, d in enumerate(start_map):
            at = batch[:vector_dim] + [ix(k)] + batch[vector_dim:] \
                if vector_dim < indices.rank else batch
            known = known_index(self.ops, op.operands[1], tuple(at))
            if known is not None and 0 <= value_range(known)[0] and \
                    value_range(known)[1] <= source.dims[d] - sizes[d]:
                # an iota's row (take_along_axis): the element's own row, in this thread group
                operand_index[d] = known
                continue
            start = self.to_s32(self.value(op.operands[1], tuple(at)))
            operand_index[d] = self.dynamic(start, source.dims[d] - sizes[d] + 1)
        windowed = [d for d in range(source.rank) if d not in collapsed]
        for d, out_dim in zip(windowed, offset_dims):
            operand_index[d] = add(operand_index[d], index[out_dim])
        return self.value(op.operands[0], tuple(operand_index))

    def scatter_form(self, op: FlatOp) -> tuple[ScatterDims, Shape, Shape, Shape]:
        """(dims, operand, indices and updates shapes) of a scatter the code generator builds;
        refuses the others."""
        if len(op.operands) != 3:
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"scatter {op.name}: variadic scatters are not supported")
        dims = ScatterDims.parse(op.attrs)
        if dims.input_batching_dims:
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"scatter {op.name}: batching dims are not supported")
        operand, indices, updates = (self.ops[o].shape for o in op.operands)
        dtype = op.shape.dtype
        if (dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(Refusal.UNSUPPORTED_COMBINER,
                               f"scatter {op.name}: combiner {op.reducer} over {dtype} "
                               f"is not supported")
        if indices.dtype != "s32":
            # A wider index narrowed to s32 could wrap into range instead of being skipped.
            raise CodegenError(Refusal.UNSUPPORTED_TYPE,
                               f"scatter {op.name}: {indices.dtype} indices are not supported "
                               f"(s32 only)")
        return dims, operand, indices, updates

    def scattered(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        """Element ``index`` of a scatter a host kernel computes once (`scatter_into_scratch`):
        by its prologue, or, where the scatter reads reductions of the kernel and the kernel
        is one thread (a host phased schedule), at its first use, once those reductions are
        staged; else in the gather form."""
        array = self.scratch.get(op.name)
        if array is None:
            reductions = producing_reductions(self.ops, op)
            if not reductions:
                outer, self.building_prologue = self.building_prologue, True
                try:
                    array, statements = self.scatter_into_scratch(op)
                finally:
                    self.building_prologue = outer
                self.prologue += statements
            elif self.one_thread and reductions <= self.staged.keys():
                array, statements = self.scatter_into_scratch(op)
                self.scopes[0] += statements  # before the loop being built reads it
            else:
                return self.scatter(op, index)
        return self.array_element(array, op.shape, index)

    def scatter_into_scratch(self, op: FlatOp) -> tuple[SharedArray, list]:
        """Statements computing scatter ``op`` as XLA:CPU does, into a scratch array of its
        shape: every element set to the operand's, then each update window in order combined
        into the elements it lands on (a window that does not fit the operand is skipped), so
        the result is XLA's bit for bit. It costs (elements + updates), where the gather form
        costs (elements x windows). The statements have scopes and a value cache of their own,
        so that they can run before the loop that asked for them."""
        dims, operand, indices, updates = self.scatter_form(op)
        dtype = op.shape.dtype
        # named by the emitter's counter: filling it may create another array first
        array = SharedArray(f"scatter{next(self.names)}", dtype, op.shape.num_elements)

        def fill():
            self.store_every_element(array, op.shape, op.operands[0])
            self.place_windows(op, dims, operand, indices, updates, array)

        statements = self.isolated(fill)
        self.scratch[op.name] = array
        return array, statements

    def store_every_element(self, array: SharedArray | int, shape: Shape, name: str) -> None:
        """array[e] = value ``name`` at element e of ``shape``, a loop over the elements in
        physical order (contiguous stores), at depth 0 of the current scopes. ``array``: a
        scratch array, or the number of an output buffer of ``shape``."""
        element = Var(f"s{next(self.names)}", shape.num_elements)
        self.open_loop(element)
        value, _ = self.value(name, delinearize(ix(element), shape))
        self.place(GlobalStore(array, ix(element), value) if isinstance(array, int) else
                   SharedStore(array, ix(element), value), 1)
        self.place(Loop(element, ix(0), element.extent, 1, self.close_loop(), []), 0)

    def array_element(self, array: SharedArray | int, shape: Shape, index: tuple[Ix, ...]
                      ) -> tuple[Value, int]:
        """Element ``index`` of a value of ``shape`` held in ``array`` (physical order; a
        scratch array, or the number of an output buffer)."""
        offset = linearize(index, shape)
        dst = self.fresh(shape.dtype if isinstance(array, int) else array.dtype)
        depth = self.index_depth(offset)
        self.place(GlobalLoad(dst, array, offset) if isinstance(array, int) else
                   SharedLoad(dst, array, offset), depth)
        return dst, depth

    def isolated(self, build) -> list:
        """The statements ``build`` places, in scopes and a value cache of their own (they run
        before the loop being built, which may not see their values)."""
        saved = self.scopes, self.cache, self.pending
        self.scopes, self.cache, self.pending = [[]], {}, {}
        try:
            build()
            return self.scopes[0]
        finally:
            self.scopes, self.cache, self.pending = saved

    def place_windows(self, op: FlatOp, dims: ScatterDims, operand: Shape, indices: Shape,
                      updates: Shape, array: SharedArray) -> None:
        """The loop over update windows (row-major over the scatter dims, as the gather form
        and XLA order them), and in each a loop over the window's elements."""
        dtype = op.shape.dtype
        window_dims = dims.update_window_dims
        scatter_dims = [d for d in range(updates.rank) if d not in window_dims]
        windowed = [d for d in range(operand.rank) if d not in dims.inserted_window_dims]
        size = [1] * operand.rank
        for d, u in zip(windowed, window_dims):
            size[d] = updates.dims[u]
        batch_shape = row_major(Shape("s32", tuple(updates.dims[d] for d in scatter_dims), ()))
        window = Var(f"w{next(self.names)}", batch_shape.num_elements)
        self.open_loop(window)
        batch = list(delinearize(ix(window), batch_shape))
        starts: list[tuple[Value, int] | None] = [None] * operand.rank
        for k, d in enumerate(dims.scatter_dims_to_operand_dims):
            at = batch[:dims.index_vector_dim] + [ix(k)] + batch[dims.index_vector_dim:] \
                if dims.index_vector_dim < indices.rank else batch
            starts[d] = self.value(op.operands[1], tuple(at))
        fits = self.all_of([self.in_range(start, 0, n - size[d] + 1)
                            for d, (start, n) in enumerate(zip(starts, operand.dims))
                            if start is not None])
        window_shape = row_major(Shape("s32", tuple(updates.dims[u] for u in window_dims), ()))
        inner = window_shape.num_elements > 1
        if inner:
            element = Var(f"k{next(self.names)}", window_shape.num_elements)
            self.open_loop(element)
            coordinates = list(delinearize(ix(element), window_shape))
        else:
            coordinates = [ix(0)] * len(window_dims)
        offset = [ix(0)] * operand.rank
        for d, coordinate in zip(windowed, coordinates):
            offset[d] = coordinate
        position = []
        for d, (start, n) in enumerate(zip(starts, operand.dims)):
            if start is None:
                position.append(offset[d])
            else:  # clamped: a window that does not fit rewrites what it read
                landing = self.op("add", "s32", start, self.index_value(offset[d]))
                position.append(self.dynamic(landing, n))
        at = [ix(0)] * updates.rank
        for k, u in enumerate(scatter_dims):
            at[u] = batch[k]
        for u, coordinate in zip(window_dims, coordinates):
            at[u] = coordinate
        update = self.value(op.operands[2], tuple(at))
        depth = len(self.scopes) - 1
        flat = linearize(tuple(position), op.shape)
        current = self.fresh(dtype)
        self.place(SharedLoad(current, array, flat), depth)
        combined = self.op(op.reducer, dtype, (current, depth), update)
        if fits is not None:
            combined = self.op("select", dtype, fits, combined, (current, depth))
        self.place(SharedStore(array, flat, combined[0]), depth)
        if inner:
            self.place(Loop(element, ix(0), element.extent, 1, self.close_loop(), []), 1)
        self.place(Loop(window, ix(0), window.extent, 1, self.close_loop(), []), 0)

    def scatter(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        """Element ``index`` of scatter(operand, indices, updates) in the gather form (module
        docstring): the operand's element combined, in update-window order, with the element of
        every update window that covers it; windows that do not fit the operand are skipped."""
        dims, operand, indices, updates = self.scatter_form(op)
        dtype = op.shape.dtype
        window_dims = dims.update_window_dims
        to_operand = dims.scatter_dims_to_operand_dims
        vector_dim = dims.index_vector_dim
        scatter_dims = [d for d in range(updates.rank) if d not in window_dims]
        extents = tuple(updates.dims[d] for d in scatter_dims)
        windowed = [d for d in range(operand.rank) if d not in dims.inserted_window_dims]
        size = [1] * operand.rank
        for d, u in zip(windowed, window_dims):
            size[d] = updates.dims[u]
        # Operand dim -> scatter dim whose window coordinate *is* the start there (an iota in
        # the indices): only the window at index[d] on that scatter dim can land.
        fixed = iota_starts(self.ops, op, to_operand, vector_dim, extents, size, operand)
        free = [s for s in range(len(extents)) if s not in fixed.values()]
        windows = math.prod(extents[s] for s in free)
        if windows > MAX_SCATTER_WINDOWS:
            raise CodegenError(Refusal.TOO_MANY_WINDOWS,
                               f"scatter {op.name}: {windows} update windows; every output "
                               f"element would scan them all (at most {MAX_SCATTER_WINDOWS})")
        init = self.value(op.operands[0], index)
        # Elements no window covers combine with the combiner's identity; -0.0 for a float
        # sum, since x + -0.0 is x for every x (+0.0 would turn an operand's -0.0 into +0.0).
        neutral = self.const(-0.0 if (op.reducer, dtype) == ("add", "f32") else
                             identity(op.reducer, dtype), dtype)
        free_shape = row_major(Shape("s32", tuple(extents[s] for s in free), ()))

        def window_value(window: Ix) -> tuple[Value, int]:
            """The element of update window ``window`` landing on ``index``, else neutral."""
            batch: list[Ix] = [ix(0)] * len(extents)
            for s, coordinate in zip(free, delinearize(window, free_shape)):
                batch[s] = coordinate
            for d, s in fixed.items():
                batch[s] = index[d]
            starts: list[tuple[Value, int] | None] = [None] * operand.rank
            for k, d in enumerate(to_operand):
                if d in fixed:
                    continue
                at = batch[:vector_dim] + [ix(k)] + batch[vector_dim:] \
                    if vector_dim < indices.rank else batch
                starts[d] = self.value(op.operands[1], tuple(at))
            valid, offset = [], [ix(0)] * operand.rank
            for d, (i, n, start) in enumerate(zip(index, operand.dims, starts)):
                if d in fixed:  # start == index[d] by construction; size 1, so it fits
                    continue
                if start is None and size[d] == n:  # the window spans the dimension
                    offset[d] = i
                    continue
                position = self.index_value(i)
                if start is not None and size[d] == 1:
                    # start == i: the window fits, since 0 <= i < n.
                    valid.append(self.compare(position, start, "EQ"))
                    continue
                if start is not None:
                    # XLA skips a window that does not fit the operand (no clamping).
                    valid.append(self.in_range(start, 0, n - size[d] + 1))
                    position = self.op("subtract", "s32", position, start)
                valid.append(self.in_range(position, 0, size[d]))
                if size[d] > 1:
                    offset[d] = self.dynamic(position, size[d])
            at: list[Ix] = [ix(0)] * updates.rank
            for k, u in enumerate(scatter_dims):
                at[u] = batch[k]
            for d, u in zip(windowed, window_dims):
                at[u] = offset[d]
            update = self.value(op.operands[2], tuple(at))
            lands = self.all_of(valid)
            return update if lands is None else self.op("select", dtype, lands, update, neutral)

        # Unrolled, the indices (the same for every element) are loaded once per thread
        # instead of once per element.
        return self.combine_in_order(op.reducer, dtype, init, windows, window_value,
                                     self.index_depth(*index), UNROLLED_SCATTER_WINDOWS)

    def combine_in_order(self, kind: str, dtype: str, init: tuple[Value, int], count: int,
                         term, depth: int, unrolled: int) -> tuple[Value, int]:
        """``init`` combined (``kind``) with term(k) for k = 0 .. count-1 in this order
        (scatter's update windows, reduce-window's window positions). Up to ``unrolled`` terms
        as straight-line code, whose loads are independent and so all in flight at once;
        beyond it a Loop with an Accumulate, placed at ``depth`` (where the terms' index is
        defined)."""
        if count <= unrolled:
            result = init
            for k in range(count):
                result = self.op(kind, dtype, result, term(ix(k)))
            return result
        depth = max(depth, init[1])
        var = Var(f"w{next(self.names)}", count)
        self.open_loop(var)
        value = term(ix(var))
        body = self.close_loop()
        result = self.fresh(dtype)
        accumulate = Accumulate(result, kind, init[0], value[0], ordered=True)
        self.place(Loop(var, ix(0), count, 1, body, [accumulate]), depth)
        return result, depth

    def reduce_window(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        """Element ``index`` of reduce-window(operand, init) (module docstring): the init
        value combined, in row-major order of the window positions, with the operand element
        at each position; positions in the padding or in a base-dilation hole are skipped."""
        dtype = op.shape.dtype
        if (dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(Refusal.UNSUPPORTED_COMBINER,
                               f"reduce-window {op.name}: combiner {op.reducer} over {dtype} "
                               f"is not supported")
        source = self.ops[op.operands[0]].shape
        window = Window.parse(op.attrs.get("window"), source.rank)
        positions = math.prod(window.size)
        if positions > MAX_WINDOW_POSITIONS:
            raise CodegenError(Refusal.TOO_MANY_WINDOWS,
                               f"reduce-window {op.name}: {positions} positions per window; "
                               f"every output element would combine them all (at most "
                               f"{MAX_WINDOW_POSITIONS})")
        # A skipped position combines with the identity (-0.0 for a float sum, as in scatter).
        neutral = self.const(-0.0 if (op.reducer, dtype) == ("add", "f32") else
                             identity(op.reducer, dtype), dtype)
        offsets_shape = row_major(Shape("s32", tuple(window.size), ()))

        def term(k: Ix) -> tuple[Value, int]:
            at, valid = [], []
            for d, offset in enumerate(delinearize(k, offsets_shape)):
                position = add(scale(index[d], window.stride[d]),
                               scale(offset, window.window_dilation[d]), -window.padding[d][0])
                i, inside = self.undilate(position, source.dims[d], window.base_dilation[d] - 1)
                at.append(i)
                valid += inside
            element = self.value(op.operands[0], tuple(at))
            lands = self.all_of(valid)
            return element if lands is None else self.op("select", dtype, lands, element, neutral)

        return self.combine_in_order(op.reducer, dtype, self.value(op.operands[1], ()), positions,
                                     term, self.index_depth(*index), UNROLLED_WINDOW_POSITIONS)


def known_index(ops: dict[str, FlatOp], name: str, index: tuple[Ix, ...]) -> Ix | None:
    """The s32 value of element ``index`` of op ``name`` as an index expression, or None
    when it depends on data (or goes through an op not followed here)."""
    op = ops[name]
    if op.shape.dtype != "s32":
        return None
    source = lambda i: ops[op.operands[i]].shape  # noqa: E731 (one line per op below)
    match op.opcode:
        case "iota":
            return index[int(op.attrs["iota_dimension"])]
        case "constant" if not op.shape.dims and op.literal is not None:
            return ix(int(parse_literal(op.literal, op.shape).reshape(-1)[0]))
        case "broadcast":
            return known_index(ops, op.operands[0], tuple(index[d] for d in op.dimensions))
        case "copy":
            return known_index(ops, op.operands[0], index)
        case "reshape":
            flat = linearize(index, row_major(op.shape))
            return known_index(ops, op.operands[0], delinearize(flat, row_major(source(0))))
        case "bitcast" if source(0).dtype == "s32":
            return known_index(ops, op.operands[0],
                               delinearize(linearize(index, op.shape), source(0)))
        case "transpose":
            moved: list[Ix] = [ix(0)] * len(index)
            for out_dim, in_dim in enumerate(op.dimensions):
                moved[in_dim] = index[out_dim]
            return known_index(ops, op.operands[0], tuple(moved))
        case "slice":
            return known_index(ops, op.operands[0], tuple(
                add(scale(i, d.stride), d.start)
                for i, d in zip(index, parse_slice(op.attrs.get("slice")))))
        case "concatenate":
            return _concatenated(ops, op, index)
    return None


def _concatenated(ops: dict[str, FlatOp], op: FlatOp, index: tuple[Ix, ...]) -> Ix | None:
    """Only where the position along the concatenated dimension is a known number."""
    dim = op.dimensions[0]
    lo, hi = value_range(index[dim])
    if lo != hi:
        return None
    start = 0
    for name in op.operands:
        size: Shape = ops[name].shape
        if lo < start + size.dims[dim]:
            local = index[:dim] + (ix(lo - start),) + index[dim + 1:]
            return known_index(ops, name, local)
        start += size.dims[dim]
    return None


def iota_starts(ops: dict[str, FlatOp], op: FlatOp, to_operand: tuple[int, ...], vector_dim: int,
                extents: tuple[int, ...], size: list[int], operand: Shape) -> dict[int, int]:
    """A scatter's operand dims whose start index is, for every window, the window's own
    coordinate on one scatter dim (``indices = concatenate(iota, labels)``), mapped to that
    scatter dim. Taken only for windows of size 1 there and a scatter dim that covers every
    row (each row then receives exactly the one window at its own coordinate)."""
    coordinates = [Var(f"window{s}", n) for s, n in enumerate(extents)]
    indices_rank = ops[op.operands[1]].shape.rank
    fixed: dict[int, int] = {}
    for k, d in enumerate(to_operand):
        batch = [ix(v) for v in coordinates]
        at = batch[:vector_dim] + [ix(k)] + batch[vector_dim:] \
            if vector_dim < indices_rank else batch
        start = known_index(ops, op.operands[1], tuple(at))
        for s, v in enumerate(coordinates):
            if start == ix(v) and size[d] == 1 and operand.dims[d] <= extents[s] \
                    and s not in fixed.values():
                fixed[d] = s
    return fixed


def producing_reductions(ops: dict[str, FlatOp], op: FlatOp) -> set[str]:
    """The pattern's reductions among ``op``'s producers (a kernel's prologue runs before
    any reduction of its schedule)."""
    return {name for name in ancestors(ops, op.name) if ops[name].opcode == "reduce"}
