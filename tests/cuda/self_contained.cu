// SPDX-License-Identifier: Apache-2.0
// Header self-containment: the public CUDA header compiles on its own under nvcc.
#include <xsoftmax/cuda.cuh>
