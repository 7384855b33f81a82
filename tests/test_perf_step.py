"""benchmarks/perf_step.py: perf samples sorted into the runtime's parts and stitched kernels
(the sampling itself needs perf and a step; benchmarks/README has its runs)."""
from benchmarks import perf_step

# perf script -F ip,sym,dso lines, as perf 6 prints them
LINES = [
    "     7f5d2402d330 [unknown] (/tmp/perf-17312.map)",
    "     7f5d2405ac53 [unknown] (/tmp/perf-17312.map)",
    "     7f5d90000010 [unknown] (/tmp/perf-17312.map)",
    "     7f5d69eb3091 _int_malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)",
    "     7f5d10000000 Eigen::ThreadPoolTempl<tsl::thread::EigenEnvironment>::GlobalSteal "
    "(/v/lib/python3.11/site-packages/jaxlib/libjax_common.so)",
    "     7f5d10000100 xla::cpu::ThunkExecutor::Execute (/v/lib/python3.11/site-packages/"
    "jaxlib/libjax_common.so)",
    "     7f5d10000200 ynn::dot_fp32_6x16x1_1x8x1_fma3 (/v/jaxlib/libjax_common.so)",
    "     7f5d10000300 xla::ifrt::PjRtLoadedExecutable::Execute (/v/jaxlib/libjax_common.so)",
    "     7f5d10000400 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)",
    " ffffffff8226e639 _raw_spin_unlock_irqrestore ([kernel.kallsyms])",
    "",
]
STARTS = [(0x7F5D24020000, "fusionstitching_k0"), (0x7F5D24050000, "fusionstitching_k1")]


def test_samples_fall_into_the_runtime_parts_and_each_stitched_kernel():
    categories, kernels, symbols = perf_step.attribute(LINES, STARTS)
    assert categories == {"JIT code": 3, "malloc/free/mem*": 1, "thread pool": 1,
                          "thunk executor": 1, "dots (YNNPACK)": 1,
                          perf_step.OTHER: 1, "Python": 1, "OS kernel": 1}
    # the third JIT sample lies far past every kernel's entry: XLA's own fusion code
    assert kernels == {"fusionstitching_k0": 1, "fusionstitching_k1": 1, perf_step.XLA_JIT: 1}
    # every sample outside JIT code is counted by its symbol and library (--symbols)
    assert sum(symbols.values()) == 7 and symbols["_int_malloc (libc.so.6)"] == 1


def test_a_library_under_a_python_directory_is_not_python():
    """jaxlib's runtime lives in site-packages of python3.11: the directory names no part."""
    ip, sym, dso = perf_step.parse_sample(LINES[7])
    assert dso == "libjax_common.so" and perf_step.category(dso, sym) == perf_step.OTHER


def test_a_sample_before_every_kernel_is_xla_code():
    assert perf_step.kernel_of(0x1000, STARTS) == perf_step.XLA_JIT
    assert perf_step.kernel_of(0x7F5D24050000, STARTS) == "fusionstitching_k1"
