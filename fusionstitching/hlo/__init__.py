"""hlo/: HLO text -> Module (parser), Module -> text (printer), numpy evaluator."""
from .ir import Computation, HloParseError, Instruction, Module, Shape
