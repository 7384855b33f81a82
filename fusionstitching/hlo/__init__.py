"""hlo/: HLO text -> Module (parser), Module -> text (ir), attributes (attrs), numpy evaluator."""
from .ir import Computation, HloParseError, Instruction, Module, Shape
