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
)

HAS_CUDA = _HAS_CUDA
HAS_HIP = _HAS_HIP
CUDA_PATH = _CUDA_PATH

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
