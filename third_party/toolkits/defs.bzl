# Macros for BUILD files with targets that need a GPU toolkit: they define the
# target only where @dmagather_toolkits found that toolkit (BUILD files may
# not use a top-level `if`), so `bazel build //...` works with and without
# CUDA and no select() is involved. For a dependency that only some builds
# have, add it to the list: `deps = [...] + if_cuda(["//x:cuda_part"])`.
load(
    "@dmagather_toolkits//:config.bzl",
    _CUDA_PATH = "CUDA_PATH",
    _HAS_CUDA = "HAS_CUDA",
    _HAS_HIP = "HAS_HIP",
    _HIP_HAS_COPY_ON_ENGINE = "HIP_HAS_COPY_ON_ENGINE",
    _HIP_HAS_MEMCPY_NOCU = "HIP_HAS_MEMCPY_NOCU",
    _HIP_PATH = "HIP_PATH",
)

HAS_CUDA = _HAS_CUDA
HAS_HIP = _HAS_HIP
CUDA_PATH = _CUDA_PATH
HIP_PATH = _HIP_PATH

# What the HIP headers offer, as defines for the hip runtime's sources.
HIP_DEFINES = (["__HIP_PLATFORM_AMD__"] +
               (["DMAGATHER_HSA_HAS_COPY_ON_ENGINE"] if _HIP_HAS_COPY_ON_ENGINE else []) +
               (["DMAGATHER_HIP_HAS_MEMCPY_NOCU"] if _HIP_HAS_MEMCPY_NOCU else []))

def if_cuda(if_true, if_false = []):
    """if_true where the CUDA toolkit was found, else if_false."""
    return if_true if _HAS_CUDA else if_false

def cuda_cc_library(**kwargs):
    if _HAS_CUDA:
        native.cc_library(**kwargs)

def cuda_cc_binary(**kwargs):
    if _HAS_CUDA:
        native.cc_binary(**kwargs)

def cuda_cc_test(tags = [], **kwargs):
    """A cc_test that needs CUDA; tagged "cuda" (tools/test_tsan.sh skips those)."""
    if _HAS_CUDA:
        native.cc_test(tags = tags + ["cuda"], **kwargs)

def cuda_genrule(**kwargs):
    if _HAS_CUDA:
        native.genrule(**kwargs)

def if_hip(if_true, if_false = []):
    """if_true where HIP (libamdhip64-dev) was found, else if_false."""
    return if_true if _HAS_HIP else if_false

def hip_cc_library(**kwargs):
    if _HAS_HIP:
        native.cc_library(**kwargs)

def hip_cc_test(tags = [], **kwargs):
    """A cc_test that needs the HIP headers/library; tagged "hip"."""
    if _HAS_HIP:
        native.cc_test(tags = tags + ["hip"], **kwargs)

def hip_cc_binary(**kwargs):
    if _HAS_HIP:
        native.cc_binary(**kwargs)
