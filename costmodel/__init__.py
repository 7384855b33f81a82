"""costmodel/: GPU devices and the host CPU, and the models that price kernels and fusion plans.

Every constant carries its source. Times produced here are *modeled*, never measured.
"""
from .devices import WARP, Device, load_device, TARGETS
from .kernel_time import LAUNCH_US, KernelCost, kernel_cost, plan_time_us
from .occupancy import Occupancy, occupancy
from .latency import (KernelProfile, LatencyBreakdown, estimate_registers, kernel_latency_us,
                      kernel_latency_lower_bound_us)
from .delta import DeltaBreakdown, DeltaEvaluator, PatternSummary, delta_evaluate
from .pricing import GpuPricing, packed_profile
from .host import HostMachine, HostPricing, host_kernel_us, this_machine
