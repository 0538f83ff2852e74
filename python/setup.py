# SPDX-License-Identifier: Apache-2.0
"""Build of the xsoftmax PyTorch extension: the CPU operators always, the CUDA operators when torch
is a CUDA build and nvcc is found (see XSOFTMAX_WITH_CUDA below).

    pip install --no-build-isolation ./python
    python -c "import xsoftmax; print(xsoftmax.build_info())"    # what was built

Environment variables:
  XSOFTMAX_INCLUDE      the library's include directory (default: ../include next to this file)
  XSOFTMAX_CUDA_INCLUDE a directory holding cuda_bf16.h / cuda_fp16.h and cccl/ (default: the CUDA
                        toolkit from CUDA_HOME / CUDA_PATH / nvcc on PATH / /usr/local/cuda, else the
                        headers of the nvidia-cuda-runtime + nvidia-cuda-cccl pip packages)
  XSOFTMAX_CBLAS        the CBLAS library to link for the dense scores ("openblas", "blis", ...);
                        default: OpenBLAS when cblas.h and libopenblas.so are found, else none;
                        "none": the built-in blocked GEMM (about 10x slower)
  XSOFTMAX_NATIVE       1: compile with -march=native (faster; the build then runs on this CPU only)
  XSOFTMAX_WITH_CUDA    auto (default): build the CUDA operators when torch has CUDA
                        (torch.version.cuda) and nvcc is found (CUDA_HOME, or nvcc on PATH); 0: CPU
                        operators only; 1: the CUDA operators or a clear error saying why not
  TORCH_CUDA_ARCH_LIST  the GPU architectures of the CUDA operators, as torch reads it ("9.0",
                        "8.0;9.0+PTX"); default: the visible GPUs' (torch's rule), or "8.0;9.0+PTX"
                        when no GPU is visible (A100, H100/H200; newer GPUs JIT-compile the PTX)
  XSOFTMAX_CUDA_PTX_ONLY 1: the CUDA operators as PTX only (for TORCH_CUDA_ARCH_LIST's architectures, no
                        ptxas) with unoptimised host code: a compile-and-link check, 30 % less nvcc
                        time (python/ci.sh sets it when no GPU is visible); a GPU then
                        JIT-compiles the PTX when the library loads. Default 0
  MAX_JOBS              parallel compile jobs (four translation units with CUDA, two without)
"""
import glob
import os
import shutil
import sys
import sysconfig

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _library_include():
    env = os.environ.get("XSOFTMAX_INCLUDE")
    candidates = [env] if env else [os.path.join(HERE, "..", "include")]
    for c in candidates:
        c = os.path.abspath(c)
        if os.path.isfile(os.path.join(c, "xsoftmax", "full_softmax.hpp")):
            return c
    sys.exit(
        "xsoftmax: cannot find the library headers (looked for xsoftmax/full_softmax.hpp in %s). "
        "Build from the repository checkout (pip install --no-build-isolation ./python) or set "
        "XSOFTMAX_INCLUDE to the repository's include/ directory." % ", ".join(map(str, candidates)))


def _cuda_header_dirs():
    """Directories with cuda_bf16.h / cuda_fp16.h and CCCL (thrust/, cub/, cuda/)."""
    roots = []
    if os.environ.get("XSOFTMAX_CUDA_INCLUDE"):
        roots.append(("include", os.environ["XSOFTMAX_CUDA_INCLUDE"]))
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT"):
        if os.environ.get(var):
            roots.append(("root", os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(("root", os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))))
    roots.append(("root", "/usr/local/cuda"))
    # pip wheels (nvidia-cuda-runtime, nvidia-cuda-cccl), installed with CUDA builds of torch
    site = sysconfig.get_paths()["purelib"]
    for inc in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")), reverse=True):
        roots.append(("include", inc))
    for kind, r in roots:
        inc = r if kind == "include" else os.path.join(r, "include")
        if os.path.isfile(os.path.join(inc, "cuda_bf16.h")):
            dirs = [inc]
            for cccl in (os.path.join(inc, "cccl"), os.path.join(os.path.dirname(inc), "cccl", "include")):
                if os.path.isdir(os.path.join(cccl, "thrust")):
                    dirs.insert(0, cccl)
                    break
            else:
                if not os.path.isdir(os.path.join(inc, "thrust")):
                    continue
            return dirs
    sys.exit("xsoftmax: cannot find <cuda_bf16.h> and CCCL (thrust). The library's headers need the CUDA "
             "toolkit headers even for a CPU build: install the CUDA toolkit, set CUDA_HOME, or set "
             "XSOFTMAX_CUDA_INCLUDE to a directory holding cuda_bf16.h (and cccl/).")


def _find_openblas():
    """'openblas' when cblas.h and libopenblas are where the compiler and linker look by default."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    include_dirs = ["/usr/include", "/usr/local/include"] + ([os.path.join("/usr/include", arch)] if arch else [])
    lib_dirs = ["/usr/lib", "/usr/local/lib", "/usr/lib64"] + ([os.path.join("/usr/lib", arch)] if arch else [])
    has_header = any(os.path.isfile(os.path.join(d, "cblas.h")) for d in include_dirs)
    has_library = any(os.path.exists(os.path.join(d, "libopenblas.so")) for d in lib_dirs)
    return "openblas" if has_header and has_library else None


DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def _want_cuda():
    """(build the CUDA operators?, why not): XSOFTMAX_WITH_CUDA auto / 0 / 1."""
    mode = os.environ.get("XSOFTMAX_WITH_CUDA", "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        sys.exit("xsoftmax: XSOFTMAX_WITH_CUDA = %r must be auto, 0 or 1" % mode)
    if mode == "0":
        return False, "XSOFTMAX_WITH_CUDA=0"
    import torch
    from torch.utils import cpp_extension
    why = None
    if not torch.version.cuda:
        why = "torch %s is not a CUDA build" % torch.__version__
    elif not cpp_extension.CUDA_HOME or not os.path.isfile(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")):
        why = "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    if why and mode == "1":
        sys.exit("xsoftmax: XSOFTMAX_WITH_CUDA=1 but the CUDA operators cannot be built: " + why)
    return why is None, why


def _cuda_archs():
    """The architectures of the CUDA operators: TORCH_CUDA_ARCH_LIST, else the visible GPUs', else the
    default (set in the environment, where torch's build reads it)."""
    import torch
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs:
        if torch.cuda.is_available():
            archs = ";".join(sorted({"%d.%d" % torch.cuda.get_device_capability(i)
                                     for i in range(torch.cuda.device_count())}))
        else:
            archs = DEFAULT_CUDA_ARCHS
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    return archs


def _ptx_only():
    """XSOFTMAX_CUDA_PTX_ONLY: 1 or 0 (default), else a clear error."""
    value = os.environ.get("XSOFTMAX_CUDA_PTX_ONLY", "0")
    if value not in ("0", "1"):
        sys.exit("xsoftmax: XSOFTMAX_CUDA_PTX_ONLY must be 0 or 1, got %r" % value)
    return value == "1"


def _ptx_gencode(archs):
    """nvcc's -gencode flags for PTX only of TORCH_CUDA_ARCH_LIST's architectures ("8.0;9.0+PTX" ->
    compute_80, compute_90): passing any arch flag makes torch add none of its own."""
    flags = []
    for arch in archs.replace(",", ";").replace(" ", ";").split(";"):
        arch = arch.strip().replace("+PTX", "")
        if not arch:
            continue
        digits = arch.replace(".", "")
        if not digits.isdigit():
            sys.exit("xsoftmax: XSOFTMAX_CUDA_PTX_ONLY=1 needs numeric TORCH_CUDA_ARCH_LIST entries "
                     "(\"9.0\", \"8.0;9.0\"), got %r" % archs)
        flags.append("-gencode=arch=compute_%s,code=compute_%s" % (digits, digits))
    return flags


def _write_build_config(cuda, archs, cblas, why_no_cuda, ptx_only):
    """xsoftmax/_build_config.py: what this build holds, for xsoftmax.build_info()."""
    with open(os.path.join(HERE, "xsoftmax", "_build_config.py"), "w") as f:
        f.write("# Written by setup.py when the extension is built: what this build holds.\n")
        f.write("CUDA = %r\nCUDA_ARCHS = %r\nCUDA_PTX_ONLY = %r\nCBLAS = %r\nWHY_NO_CUDA = %r\n"
                % (cuda, archs, ptx_only, cblas, why_no_cuda))


def _header_dependencies(include_dir):
    """The headers the operators include (the library's and csrc/'s): setuptools rebuilds the
    extension only when a listed file is newer than the built module, and it lists the sources
    alone by default, so a changed header would leave a stale module in place (pip builds in
    ./build and reuses it)."""
    headers = []
    for root, pattern in ((include_dir, "**/*"), (os.path.join(HERE, "csrc"), "*")):
        for path in glob.glob(os.path.join(root, pattern), recursive=True):
            if path.endswith((".hpp", ".cuh", ".inl", ".h")):
                headers.append(path)
    return sorted(headers)


def _extensions():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    include_dirs = [_library_include()] + _cuda_header_dirs()
    cxx = ["-O3", "-fopenmp", "-DNDEBUG", "-Wno-unused-parameter", "-Wno-deprecated"]
    if os.environ.get("XSOFTMAX_NATIVE") == "1":  # tune for this machine's CPU (not portable)
        cxx.append("-march=native")
    link = ["-fopenmp"]
    libraries = []
    cblas = os.environ.get("XSOFTMAX_CBLAS")
    if cblas is None:
        cblas = _find_openblas()
        if cblas:
            print("xsoftmax: found OpenBLAS (cblas.h and libopenblas): the dense scores use it "
                  "(XSOFTMAX_CBLAS=none builds with the built-in blocked GEMM, about 10x slower)", file=sys.stderr)
        else:
            print("xsoftmax: no CBLAS found (Debian: apt-get install libopenblas-openmp-dev): the dense scores "
                  "use the built-in blocked GEMM, about 10x slower than a BLAS", file=sys.stderr)
    if cblas == "none":
        cblas = None
    if cblas:
        cxx.append("-DXSOFTMAX_HAS_CBLAS=1")
        libraries.append(cblas)
    cuda, why_no_cuda = _want_cuda()
    archs = _cuda_archs() if cuda else ""
    ptx_only = cuda and _ptx_only()
    _write_build_config(cuda, archs, cblas or "", why_no_cuda, ptx_only)
    print("xsoftmax: include directories: %s" % include_dirs, file=sys.stderr)
    sources = [os.path.join("csrc", "ops.cpp"), os.path.join("csrc", "sharded_ops.cpp"),
               os.path.join("csrc", "tree_builders.cpp")]
    depends = _header_dependencies(include_dirs[0])
    if not cuda:
        print("xsoftmax: building the CPU operators only (%s)" % why_no_cuda, file=sys.stderr)
        return [CppExtension(name="xsoftmax._C", sources=sources, include_dirs=include_dirs, depends=depends,
                             extra_compile_args={"cxx": cxx}, extra_link_args=link, libraries=libraries)]
    print("xsoftmax: building the CPU and CUDA operators (CUDA architectures %s%s)"
          % (archs, ", PTX only, host code unoptimised" if ptx_only else ""), file=sys.stderr)
    cxx.append("-DXSOFTMAX_TORCH_WITH_CUDA=1")
    # torch adds -D__CUDA_NO_HALF_OPERATORS__ and friends to every nvcc command; the library's
    # bf16/fp16 kernels use CUDA's own half and bfloat16 operators and conversions: undefine them.
    nvcc = (_ptx_gencode(archs) if ptx_only else ["-O3"]) + [
        "-DNDEBUG", "-DXSOFTMAX_TORCH_WITH_CUDA=1", "--extended-lambda",
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__"]
    cuda_sources = [os.path.join("csrc", "ops_cuda.cu"), os.path.join("csrc", "sharded_ops_cuda.cu")]
    return [CUDAExtension(name="xsoftmax._C", sources=sources + cuda_sources, depends=depends,
                          include_dirs=include_dirs, extra_compile_args={"cxx": cxx, "nvcc": nvcc},
                          extra_link_args=link, libraries=libraries + ["cublas"])]


def _build_ext():
    from torch.utils.cpp_extension import BuildExtension
    return BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)


os.chdir(HERE)
setup(
    name="xsoftmax",
    version="0.1.0",
    description="PyTorch softmax heads for extreme classification (full, hierarchical, sampled, KNN) "
                "on the xsoftmax C++ library",
    license="Apache-2.0",
    packages=find_packages(include=["xsoftmax", "xsoftmax.*"]),
    ext_modules=_extensions(),
    cmdclass={"build_ext": _build_ext()},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
    zip_safe=False,
)
